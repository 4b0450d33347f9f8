"""Korean messages of labsupport.widgets.beam."""

MESSAGES = {
    "prompt": "프롬프트",
    "beam width B": "빔 폭 B",
    "depth": "깊이",
    "length penalty α": "길이 페널티 α",
    "False (HF default)": "False (HF 기본값)",
    "beam search": "빔 서치",
    "greedy (B = 1)": "그리디 (B = 1)",
    "text": "텍스트",
    "score (Σ ln p / len^α)": "점수 (Σ ln p / len^α)",
    "score difference (log₂): <b>{diff:+.2f}</b>": "점수 차 (log₂): <b>{diff:+.2f}</b>",
    "the two outputs have different lengths: compare their scores, not the raw sums":
        "두 출력의 길이가 다릅니다: 합계가 아니라 점수를 비교하세요",
    "{calls} model call, {forwards} token-forwards": "모델 호출 {calls}번, 토큰 순전파 {forwards}번",
    "{calls} model calls, {forwards} token-forwards": "모델 호출 {calls}번, 토큰 순전파 {forwards}번",
}
