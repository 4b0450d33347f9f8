"""Korean messages of labsupport.widgets.speculative."""

MESSAGES = {
    "draft model": "초안 모델",
    "acceptance α": "수락률 α",
    "draft length γ": "초안 길이 γ",
    "draft cost c": "초안 비용 c",
    "verify cost/token s": "검증 비용/토큰 s",
    "proposer": "제안 방식",
    "temperature": "온도",
    "seed": "시드",
    "Speed-up vs γ at α = {alpha:.2f}, c = {c:.2f}, v(γ) = 1 + {s:.2f}γ":
        "γ에 따른 속도 향상 (α = {alpha:.2f}, c = {c:.2f}, v(γ) = 1 + {s:.2f}γ)",
    "12 simulated rounds at γ = {gamma} (t = the target's own token)":
        "γ = {gamma}에서 시뮬레이션한 라운드 12개 (t = 타깃 모델 자신의 토큰)",
    "tokens / target forward (theory)": "토큰 / 타깃 순전파 (이론)",
    "Monte Carlo ({n} rounds)": "몬테카를로 (라운드 {n}개)",
    "speed-up theory / MC": "속도 향상 이론 / MC",
    "best γ": "최적 γ",
    "≥ {gamma} (edge of the range, {speedup:.2f}×)": "≥ {gamma} (범위의 끝, {speedup:.2f}×)",
    "First rounds: {proposer}, γ = {gamma}, T = {t:g}": "처음 몇 라운드: {proposer}, γ = {gamma}, T = {t:g}",
    "measured α": "측정한 α",
    "tokens / target forward": "토큰 / 타깃 순전파",
    "theory at that α": "그 α에서의 이론값",
    "target forwards": "타깃 순전파 횟수",
    "{forwards} for {tokens} tokens": "토큰 {tokens}개에 {forwards}회",
}
