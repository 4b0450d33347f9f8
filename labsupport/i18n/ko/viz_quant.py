"""Korean messages of labsupport.viz.quant."""

MESSAGES = {
    "relative error (log)": "상대 오차 (로그)",
    "format": "형식",
    "Rounding error of one real weight matrix, per format and scale granularity":
        "실제 가중치 행렬 하나의 반올림 오차: 형식과 스케일 단위별",
    "median channel {median:.2f}": "중앙값 채널 {median:.2f}",
    "hidden channel (sorted by max |x|)": "은닉 채널 (max |x| 순 정렬)",
    "max |activation|": "max |활성값|",
    "Input of {name}: top channel {top:.1f} = {ratio} the median": "{name}의 입력: 최대 채널 {top:.1f} = 중앙값의 {ratio}",
    "{tokens:,} tokens<br>max |Δ logit| {drift:.2g}": "토큰 {tokens:,}개<br>max |Δ logit| {drift:.2g}",
    "tokens that fit": "들어가는 토큰 수",
    "two": "두",
    "three": "세",
    "four": "네",
    "One KV memory budget, {n} ways to store it": "KV 메모리 예산 하나, 저장 방식 {n} 가지",
}
