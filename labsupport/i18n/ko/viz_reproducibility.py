"""Korean messages of labsupport.viz.reproducibility."""

MESSAGES = {
    "sequential": "순차 합",
    "pairwise": "쌍별 합",
    "bound": "상한",
    "numbers summed (n)": "더한 수의 개수 (n)",
    "relative error |sum − exact| / Σ|x| (median)": "상대 오차 |합 − 정확한 값| / Σ|x| (중앙값)",
    "One sum, two orders: measured error (lines) and the worst-case bound (dotted)":
        "같은 합, 두 가지 순서: 측정한 오차(선)와 최악의 경우 상한(점선)",
    "largest |Δ logit| vs alone (log; 0 = bit-identical)": "혼자일 때 대비 가장 큰 |Δ 로짓| (로그; 0 = 비트 단위로 같음)",
    "requests in the batch": "배치 안의 요청 수",
    "One request's logits in a batch against the same request alone": "배치 안에서 본 요청 하나의 로짓 대 같은 요청 혼자일 때",
    "completion {k}": "완성 {k}",
    "batch mixes": "배치 조합 수",
    "Distinct completions of one prompt over the same batch mixes": "같은 배치 조합들에서 프롬프트 하나가 받은 서로 다른 완성",
}
