"""Korean messages of labsupport.widgets.sampling."""

MESSAGES = {
    # temperature panel
    "prompt": "프롬프트",
    "temperature T": "온도 T",
    "add {shift:+g} to every logit": "모든 로짓에 {shift:+g} 더하기",
    "reset shift": "이동 초기화",
    "real model": "실제 모델",
    "edit logits ({n} candidates)": "로짓 편집 (후보 {n}개)",
    "entropy H (over these {n} candidates only)": "엔트로피 H (이 후보 {n}개만)",
    "entropy H (over all {n:,} tokens)": "엔트로피 H (전체 토큰 {n:,}개)",
    "{n} candidates (edited)": "후보 {n}개 (편집됨)",
    "top {n} next tokens": "다음 토큰 상위 {n}개",
    "probability p at T = {t:g} (greedy)": "T = {t:g}에서의 확률 p (그리디)",
    "probability p at T = {t:g}": "T = {t:g}에서의 확률 p",
    "Next token after “{prompt}”": "“{prompt}” 다음 토큰",
    "max probability": "최대 확률",
    "{h:.2f} bits": "{h:.2f}비트",
    "perplexity 2<sup>H</sup>": "퍼플렉서티 2<sup>H</sup>",
    "candidates for 90 %": "90 %에 필요한 후보",
    "{k:,} of {n:,}": "{n:,}개 중 {k:,}개",
    "logits shifted by {offset:+g}: max |Δp|": "로짓 {offset:+g} 이동: 최대 |Δp|",
    "(prompt cut to its last {n} tokens)": "(프롬프트를 마지막 토큰 {n}개로 잘랐습니다)",
    # sampling lab
    "<b>{n} samples</b> (one generator seeded with {seed}): <b>{distinct} distinct</b> continuations, "
    "{first} distinct first tokens.":
        "<b>샘플 {n}개</b> (생성기 하나, 시드 {seed}): 서로 다른 이어 쓰기 <b>{distinct}개</b>, "
        "서로 다른 첫 토큰 {first}개.",
    "temperature T (0 = greedy)": "온도 T (0 = 그리디)",
    "top-k (0 = off)": "top-k (0 = 끔)",
    "top-p (1 = off)": "top-p (1 = 끔)",
    "min-p (0 = off)": "min-p (0 = 끔)",
    "repetition penalty θ (1 = off)": "반복 페널티 θ (1 = 끔)",
    "frequency penalty (0 = off)": "빈도 페널티 (0 = 끔)",
    "presence penalty (0 = off)": "존재 페널티 (0 = 끔)",
    "seed": "시드",
    "new tokens": "새 토큰 수",
    "{n} samples": "샘플 {n}개",
    "{n:,} by {name}": "{name}: {n:,}개",
    "none": "없음",
    "candidates kept": "남은 후보",
    "cut": "잘린 후보",
    "entropy before the cut": "자르기 전 엔트로피",
    "seed {seed}, {n} tokens, finish reason “{reason}”, Σ log₂ p under the model = {bits:.1f} bits":
        "시드 {seed}, 토큰 {n}개, 종료 이유 “{reason}”, 모델의 Σ log₂ p = {bits:.1f}비트",
}
