"""Korean messages of labsupport.viz.structured."""

MESSAGES = {
    "The automaton: states and byte transitions": "오토마톤: 상태와 바이트 전이",
    "state": "상태",
    "state {s} (accepting)": "상태 {s} (수락 상태)",
    "state {s}": "상태 {s}",
    "Top candidates: model vs grammar-masked": "상위 후보: 모델 vs 문법 마스크 적용",
    "model (no grammar)": "모델 (문법 없음)",
    "sampled from (mask + temperature)": "샘플링 분포 (마스크 + 온도)",
    "refused by the grammar (p = 0)": "문법이 거부 (p = 0)",
    "candidate token": "후보 토큰",
    "probability": "확률",
    "Allowed tokens at each step": "스텝별 허용 토큰",
    "allowed tokens": "허용 토큰",
    "step (the chosen token is written above its bar)": "스텝 (고른 토큰을 막대 위에 적음)",
    "allowed of {vocab:,}": "허용 토큰 ({vocab:,}개 중)",
    "Cost of the mask per decode step": "디코드 스텝당 마스크 비용",
    "ours (cached mask)": "이 강의의 구현 (캐시한 마스크)",
    "one model decode step: {us:,.0f} µs": "모델 디코드 스텝 한 번: {us:,.0f} µs",
    "µs per step (log)": "스텝당 µs (로그)",
}
