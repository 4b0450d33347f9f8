"""Korean messages of ``labsupport.lab`` (the set-up banner)."""

MESSAGES = {
    "{name}: GPT-2 with {layers} layers, {heads} heads of {head_dim}, d_model {d_model},\n"
    "{params:.2f} M parameters ({mb:.1f} MB in fp32), vocabulary |V| = {vocab:,} tokens, on {device}":
        "{name}: GPT-2, 층 {layers}개, 헤드 {heads}개(헤드당 {head_dim}차원), d_model {d_model},\n"
        "파라미터 {params:.2f} M개(fp32로 {mb:.1f} MB), 어휘 |V| = {vocab:,}개 토큰, 장치 {device}",
}
