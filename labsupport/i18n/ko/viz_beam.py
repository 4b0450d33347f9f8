"""Korean messages of labsupport.viz.beam."""

MESSAGES = {
    # trace names (the legend) and node statuses
    "pruned edges": "잘린 가지",
    "beam edges": "빔 가지",
    "best path": "최고 경로",
    "pruned": "잘림",
    "beam": "빔",
    "finished": "완료",
    "prompt": "프롬프트",
    "kept": "유지",
    "root": "루트",
    # hover texts
    "token {token!r} (id {id})<br>log₂ p(token) = {log2p:.2f}<br>cumulative log₂ p = {cum:.2f}<br>status: {status}":
        "토큰 {token!r} (id {id})<br>log₂ p(토큰) = {log2p:.2f}<br>누적 log₂ p = {cum:.2f}<br>상태: {status}",
    "<br>finished ({reason}), score {score:.3f}": "<br>완료 ({reason}), 점수 {score:.3f}",
    "prompt: “{text}”": "프롬프트: “{text}”",
    # titles and axes
    "Beam search, B = {width}, α = {alpha:g}: best “{text}” "
    "(Σ log₂ p = {bits:.1f}, score Σ ln p / len^α = {score:.2f})":
        "빔 서치, B = {width}, α = {alpha:g}: 최고 “{text}” "
        "(Σ log₂ p = {bits:.1f}, 점수 Σ ln p / len^α = {score:.2f})",
    "generated tokens (depth)": "생성한 토큰 (깊이)",
    # length_penalty_figure
    "{label} (len {length})": "{label} (길이 {length})",
    "Length normalisation: score = Σ log p / len^α": "길이 정규화: 점수 = Σ log p / len^α",
    "length penalty α": "길이 페널티 α",
    "score − best score at this α": "점수 − 이 α에서의 최고 점수",
    "score (nats per len^α)": "점수 (len^α당 nat)",
}
