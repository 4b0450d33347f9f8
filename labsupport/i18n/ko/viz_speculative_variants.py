"""Korean messages of labsupport.viz.speculative_variants."""

MESSAGES = {
    "Verified token tree": "검증한 토큰 트리",
    "candidate edge": "후보 간선",
    "accepted path": "수락된 경로",
    "nodes (root purple, accepted green)": "노드 (루트 보라, 수락 초록)",
    "target's next token": "타깃 모델의 다음 토큰",
    "depth (position after the pending token)": "깊이 (대기 중인 토큰 다음의 위치)",
    "Measured vs predicted speed-up": "속도 향상: 측정 vs 예측",
    "measured = predicted": "측정 = 예측",
    "{method} · {prompt} · batch {batch}": "{method} · {prompt} · 배치 {batch}",
    "methods (orange: batch 1, blue: batch 8)": "방법 (주황: 배치 1, 파랑: 배치 8)",
    "predicted = (p + n) / (p + n / dec), dec = tokens per round / (c + v)": "예측 = (p + n) / (p + n / dec), dec = 라운드당 토큰 / (c + v)",
    "measured wall-clock speed-up": "측정한 실제 속도 향상",
    "Speed-up against batch size": "배치 크기에 따른 속도 향상",
    "speed-up": "속도 향상",
    "plain decoding (1×)": "일반 디코딩 (1×)",
    "batch size (sequences per step)": "배치 크기 (스텝당 시퀀스)",
    "speed-up over plain decoding": "일반 디코딩 대비 속도 향상",
}
