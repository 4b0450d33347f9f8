"""Korean messages of labsupport.viz.kv."""

MESSAGES = {
    "no cache (O(n²))": "캐시 없음 (O(n²))",
    "KV cache (O(n))": "KV 캐시 (O(n))",
    "Positions computed, P = {P}: {ratio:.2f}× fewer with the cache after {step} step":
        "계산한 위치 수, P = {P}: {step} 스텝 후 캐시를 쓰면 {ratio:.2f}× 적음",
    "Positions computed, P = {P}: {ratio:.2f}× fewer with the cache after {step} steps":
        "계산한 위치 수, P = {P}: {step} 스텝 후 캐시를 쓰면 {ratio:.2f}× 적음",
    "decode steps (generated tokens)": "디코드 스텝 (생성한 토큰)",
    "cumulative positions computed": "누적 계산 위치 수",
    "computed this step": "이번 스텝에 계산",
    "reused from the cache": "캐시에서 재사용",
    "not generated yet": "아직 생성 전",
    "prefill": "프리필",
    "decode step {step}": "디코드 스텝 {step}",
    "{n} position": "위치 {n}개",
    "{n} positions": "위치 {n}개",
    "{label}: {without} computed without a cache, {with_cache} with it":
        "{label}: 캐시 없이 {without}, 캐시로 {with_cache} 계산",
    "KV cache": "KV 캐시",
    "no cache": "캐시 없음",
    "position (prompt | generated)": "위치 (프롬프트 | 생성)",
    "Measured: whole-generation time vs new tokens (this machine)": "측정: 새 토큰 수에 따른 전체 생성 시간 (이 컴퓨터)",
    "new tokens n": "새 토큰 n",
    "seconds": "초",
    "prefill of {n} tokens (TTFT)": "토큰 {n}개 프리필 (TTFT)",
    "output tokens": "출력 토큰",
    "One request: TTFT {ttft:.1f} ms, then a token every ≈ {tpot:.2f} ms (TPOT)":
        "요청 하나: TTFT {ttft:.1f} ms, 그 뒤 ≈ {tpot:.2f} ms마다 토큰 하나 (TPOT)",
    "milliseconds since the request arrived": "요청 도착 후 경과 시간 (ms)",
    "weights (bf16)": "가중치 (bf16)",
    "KV cache ({dtype})": "KV 캐시 ({dtype})",
    "{gb:.0f} GB (one H100)": "{gb:.0f} GB (H100 한 장)",
    "{model}, s = {s:,}, b = {b}: {per_token}/token, weights + KV = {gb:.1f} GB":
        "{model}, s = {s:,}, b = {b}: 토큰당 {per_token}, 가중치 + KV = {gb:.1f} GB",
    "GB (10⁹ bytes)": "GB (10⁹ 바이트)",
    "step time t(B)": "스텝 시간 t(B)",
    "throughput B / t(B)": "처리량 B / t(B)",
    "tokens/s": "토큰/s",
    "ceiling BW/K = {ceiling:,.0f} tokens/s": "상한 BW/K = {ceiling:,.0f} 토큰/s",
    "t(B) = (W + B·K)/BW with W = {W:g} GB, K = {K:g} GB, BW = {BW:g} TB/s":
        "t(B) = (W + B·K)/BW, 여기서 W = {W:g} GB, K = {K:g} GB, BW = {BW:g} TB/s",
    "batch B (requests)": "배치 B (요청 수)",
    "ms per step": "스텝당 ms",
}
