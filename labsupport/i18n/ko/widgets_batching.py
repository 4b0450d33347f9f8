"""Korean messages of labsupport.widgets.batching."""

MESSAGES = {
    "K (GB/request)": "K (GB/요청)",
    "W (GB weights)": "W (가중치 GB)",
    "t(1) = {t1:.2f} ms, t(64) = {t64:.2f} ms → throughput ×{gain:.1f}; ceiling BW/K = {ceiling:,.0f} tokens/s":
        "t(1) = {t1:.2f} ms, t(64) = {t64:.2f} ms → 처리량 ×{gain:.1f}; 상한 BW/K = {ceiling:,.0f} 토큰/s",
    "length spread": "길이 차이",
    "batch size": "배치 크기",
    "requests": "요청 수",
    "static batching": "정적 배칭",
    "continuous batching": "연속 배칭",
    "Slots over time (blue = short request, orange = long, grey = idle)": "시간에 따른 슬롯 (파랑 = 짧은 요청, 주황 = 긴 요청, 회색 = 유휴)",
    "lengths {short} and {long} tokens, batch {b}, {n} requests": "길이 {short} 토큰과 {long} 토큰, 배치 {b}, 요청 {n}개",
    "<b>static</b>: {steps} steps, utilisation {util:.1f} % (closed form {closed:.1f} %)":
        "<b>정적</b>: {steps} 스텝, 활용률 {util:.1f} % (닫힌 식 {closed:.1f} %)",
    "<b>continuous</b>: {steps} steps, utilisation {util:.1f} %": "<b>연속</b>: {steps} 스텝, 활용률 {util:.1f} %",
    "speed-up simulated ×{simulated:.2f}; closed form (endless queue) ×{closed:.2f}":
        "속도 향상: 시뮬레이션 ×{simulated:.2f}, 닫힌 식(끝없는 대기열) ×{closed:.2f}",
    "<b>{name}</b>: {ok}/{total} requests within the SLO, goodput {goodput:.2f} of {rate:.2f} req/s":
        "<b>{name}</b>: 요청 {total}개 중 {ok}개가 SLO 이내, 굿풋 {goodput:.2f} / {rate:.2f} req/s",
    "requests/s": "요청/s",
    "long prompt": "긴 프롬프트",
    "chunk (tokens)": "청크 (토큰)",
    "colocated ×2": "통합 구성 ×2",
    "chunked prefill ×2": "청크 프리필 ×2",
    "1 prefill + 1 decode": "프리필 1대 + 디코드 1대",
    "Latency on two H100s (Llama 3 8B cost model)": "H100 두 대의 지연 시간 (Llama 3 8B 비용 모델)",
}
