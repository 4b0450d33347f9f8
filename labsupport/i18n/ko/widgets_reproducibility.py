"""Korean messages of labsupport.widgets.reproducibility."""

MESSAGES = {
    "default": "기본",
    "batch-invariant": "배치 불변",
    "batch {k}": "배치 {k}",
    "{dtype}, {mode}, batch of {b}: largest |Δ logit| <b>{worst:.2g}</b> · bit-identical in <b>{same} of "
    "{n}</b> random batches · a greedy token changed in <b>{flips}</b>":
        "{dtype}, {mode}, 배치 {b}개: 가장 큰 |Δ 로짓| <b>{worst:.2g}</b> · 무작위 배치 <b>{n}개 중 {same}개</b>에서 "
        "비트 단위로 같음 · 그리디 토큰이 바뀐 배치 <b>{flips}개</b>",
}
