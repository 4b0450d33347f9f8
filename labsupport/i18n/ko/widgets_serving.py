"""Korean messages of labsupport.widgets.serving."""

MESSAGES = {
    "error: {kind}: {message}": "오류: {kind}: {message}",
    "deviation": "편차",
    "random": "무작위",
    "none": "없음",
    "final": "제자리",
    "zero": "0부터",
    "{method}, chunks at {positions}": "{method}, 청크 위치: {positions}",
    "recompute r (%)": "재계산 r (%)",
    "select by": "선택 기준",
    "chunk positions": "청크 위치",
    "select by none: the chunks' caches reused as they are, nothing recomputed (r does not apply): KL = {kl:.4f} nats, top-1 = {top1:.0%}, compute ≈ {compute:.0%} of a full prefill":
        "선택 기준 없음: 청크의 캐시를 그대로 재사용하고 아무것도 재계산하지 않음(r은 적용되지 않음): KL = {kl:.4f} nats, top-1 = {top1:.0%}, 계산량 ≈ 전체 프리필의 {compute:.0%}",
    "r = {r} % ({n} of {T} context tokens): KL = {kl:.4f} nats, top-1 = {top1:.0%}, compute ≈ {compute:.0%} of a full prefill":
        "r = {r} % (컨텍스트 토큰 {T}개 중 {n}개): KL = {kl:.4f} nats, top-1 = {top1:.0%}, 계산량 ≈ 전체 프리필의 {compute:.0%}",
    "pool blocks": "풀 블록 수",
    "CPU tier (blocks)": "CPU 계층 (블록)",
    "disk tier (blocks)": "디스크 계층 (블록)",
    "{n} requests: {computed:,} of {total:,} prompt tokens computed; audit of every tier passed":
        "요청 {n}개: 프롬프트 토큰 {total:,}개 중 {computed:,}개 계산, 모든 계층의 감사 통과",
}
