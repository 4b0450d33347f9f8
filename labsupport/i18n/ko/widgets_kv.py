"""Korean messages of labsupport.widgets.kv."""

MESSAGES = {
    "prompt P": "프롬프트 P",
    "new tokens n": "새 토큰 n",
    "step": "스텝",
    "play": "재생",
    "step {t}: this step {none_now} (no cache) / {cache_now} (cache) · so far {none_all:,} / {cache_all:,} · saving <b>{saving:.2f}×</b> (at n = {n}: {final:.2f}×)":
        "스텝 {t}: 이번 스텝 {none_now}(캐시 없음) / {cache_now}(캐시) · 누적 {none_all:,} / {cache_all:,} · 절감 <b>{saving:.2f}×</b> (n = {n}에서: {final:.2f}×)",
    "preset": "프리셋",
    "attention": "어텐션",
    "KV precision": "KV 정밀도",
    "sequence s": "시퀀스 s",
    "batch b": "배치 b",
    "structure (L / H_kv / d_head): {L} / {H_kv} / {d_head} · KV per token: <b>{per_token}</b> · KV cache: <b>{kv}</b> · weights + KV: {total:.1f} GB (fits in 80 GB) · KV / weights = {ratio:.2f}":
        "구조(L / H_kv / d_head): {L} / {H_kv} / {d_head} · 토큰당 KV: <b>{per_token}</b> · KV 캐시: <b>{kv}</b> · 가중치 + KV: {total:.1f} GB (80 GB에 들어감) · KV / 가중치 = {ratio:.2f}",
    "structure (L / H_kv / d_head): {L} / {H_kv} / {d_head} · KV per token: <b>{per_token}</b> · KV cache: <b>{kv}</b> · weights + KV: {total:.1f} GB (does not fit in 80 GB) · KV / weights = {ratio:.2f}":
        "구조(L / H_kv / d_head): {L} / {H_kv} / {d_head} · 토큰당 KV: <b>{per_token}</b> · KV 캐시: <b>{kv}</b> · 가중치 + KV: {total:.1f} GB (80 GB에 들어가지 않음) · KV / 가중치 = {ratio:.2f}",
}
