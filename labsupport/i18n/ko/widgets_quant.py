"""Korean messages of labsupport.widgets.quant."""

MESSAGES = {
    "format": "형식",
    "tensor": "텐서",
    "channel": "채널",
    "group": "그룹",
    "scale per": "스케일 단위",
    "group size": "그룹 크기",
    "method": "방법",
    "tick at least one of attn / mlp / lm_head to quantise": "양자화할 attn / mlp / lm_head 중 하나 이상을 체크하세요",
    "perplexity <b>{ppl:.2f}</b> (fp32 {ref:.2f}, {change:+.1f} %) · top-1 agreement with fp32 "
    "<b>{agree:.1f} %</b> · model <b>{mb:.1f} MB</b> (fp32 {fp32_mb:.1f} MB) · predicted step "
    "{step:.2f} ms vs {fp32_step:.2f} ms ({ratio:.2f}× at {gbs:.1f} GB/s, weights only)":
        "퍼플렉서티 <b>{ppl:.2f}</b> (fp32 {ref:.2f}, {change:+.1f} %) · fp32와의 top-1 일치율 "
        "<b>{agree:.1f} %</b> · 모델 <b>{mb:.1f} MB</b> (fp32 {fp32_mb:.1f} MB) · 예측 스텝 "
        "{step:.2f} ms vs {fp32_step:.2f} ms ({gbs:.1f} GB/s에서 {ratio:.2f}×, 가중치만)",
    "per group of {size}": "그룹별 ({size}개씩)",
    "per tensor": "텐서별",
    "per channel": "채널별",
    "{fmt}: a cast, no scale — no rounding error at all": "{fmt}: 형 변환, 스케일 없음 — 반올림 오차가 전혀 없음",
    "{fmt}: a cast, no scale: the mantissa's rounding": "{fmt}: 형 변환, 스케일 없음: 가수의 반올림",
    "{fmt}, {scale}, {method}: error of each matrix": "{fmt}, {scale}, {method}: 행렬별 오차",
}
