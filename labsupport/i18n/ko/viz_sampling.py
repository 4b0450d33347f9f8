"""Korean messages of labsupport.viz.sampling."""

MESSAGES = {
    # distribution_figure
    "logits": "로짓",
    "probability": "확률",
    "logit z (model score)": "로짓 z (모델 점수)",
    "probability p": "확률 p",
    "probability p at T = {t:g}": "T = {t:g}에서의 확률 p",
    "top {n} next tokens": "다음 토큰 상위 {n}개",
    "Next-token distribution": "다음 토큰 분포",
    # filter_figure
    "kept: probability sampled from": "남음: 샘플링에 쓰는 확률",
    "%{customdata}: sampled with p = %{x:.4f}<extra></extra>": "%{customdata}: p = %{x:.4f}로 샘플링<extra></extra>",
    "cut (reason)": "잘림 (이유)",
    "cut by {reason}": "잘림: {reason}",
    "%{customdata}: %{text}, p before = %{x:.4f}<extra></extra>":
        "%{customdata}: %{text}, 자르기 전 p = %{x:.4f}<extra></extra>",
    "before the cut": "자르기 전",
    "%{customdata}: p before the cut = %{x:.4f}<extra></extra>": "%{customdata}: 자르기 전 p = %{x:.4f}<extra></extra>",
    "next-token candidates": "다음 토큰 후보",
    "Which candidates survive the filters": "필터를 통과하는 후보",
    # entropy_curve_figure
    "entropy": "엔트로피",
    "T = %{x:.2f}: H = %{y:.2f} bits<extra></extra>": "T = %{x:.2f}: H = %{y:.2f}비트<extra></extra>",
    "current T": "현재 T",
    "temperature T": "온도 T",
    "entropy H (bits)": "엔트로피 H (비트)",
    "Entropy and perplexity of the next token vs temperature": "온도에 따른 다음 토큰의 엔트로피와 퍼플렉서티",
    # chosen_prob_figure
    "chosen token": "고른 토큰",
    "step %{x}: %{customdata} p = %{y:.3f}<extra></extra>": "스텝 %{x}: %{customdata} p = %{y:.3f}<extra></extra>",
    "generation step: the token chosen": "생성 스텝: 고른 토큰",
    "p(chosen token)": "p(고른 토큰)",
    "Probability of each chosen token": "고른 토큰마다의 확률",
    "{title}  (orange: inside the loop)": "{title}  (주황: 반복 루프 안)",
    "greedy": "그리디",
}
