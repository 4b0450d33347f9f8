"""Paged attention equals ordinary attention for every metadata shape the fast paths pick."""

import pytest
import torch

from labsupport.engine.attention import build_metadata, gather_kv, paged_attention, write_kv

H, D, BS = 3, 8, 4


def _dense(q, k, v, start):
    """Causal attention of q (new tokens at positions start…) over k, v (every token so far)."""
    n = q.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q, k) * D ** -0.5
    allowed = torch.arange(k.shape[0])[None, :] <= (start + torch.arange(n))[:, None]
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, v).reshape(n, H * D)


@pytest.mark.parametrize(("query_lens", "starts", "mask_shape", "scattered"), [
    ([1], [9], None, False),                        # one request decoding: no mask at all
    ([1, 1], [6, 6], None, False),                  # equal contexts: every query sees every key
    ([1, 1, 1], [2, 9, 5], (3, H, 1, 10), False),   # ragged decode: one mask row per head
    ([7], [0], (1, 1, 7, 7), False),                # one prompt: the causal triangle, no scatter
    ([3, 1], [5, 2], (2, 1, 3, 8), True),           # a prefill chunk next to a decode: scattered rows
])
def test_paged_attention_equals_dense_attention(query_lens, starts, mask_shape, scattered):
    gen = torch.Generator().manual_seed(0)
    ctx = [s + q for s, q in zip(starts, query_lens)]
    num_blocks = sum(-(-c // BS) for c in ctx) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()          # blocks scattered in the pool
    tables, used = [], 0
    for c in ctx:
        tables.append(order[used:used + -(-c // BS)])
        used += len(tables[-1])
    cache = torch.zeros(2, num_blocks, BS, H, D)
    ks = [torch.randn(c, H, D, generator=gen) for c in ctx]
    vs = [torch.randn(c, H, D, generator=gen) for c in ctx]
    qs = [torch.randn(q, H, D, generator=gen) for q in query_lens]
    for table, k, v, s in zip(tables, ks, vs, starts):                   # the cached prefix, as earlier steps left it
        slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(s)], dtype=torch.long)
        write_kv(cache, k[:s], v[:s], slots)
    meta = build_metadata(query_lens, starts, tables, BS, num_heads=H)
    assert (None if meta.mask is None else tuple(meta.mask.shape)) == mask_shape
    assert (meta.query_index is not None) == scattered
    out = paged_attention(torch.cat(qs), torch.cat([k[s:] for k, s in zip(ks, starts)]),
                          torch.cat([v[s:] for v, s in zip(vs, starts)]), cache, meta, D ** -0.5)
    expected = torch.cat([_dense(q, k, v, s) for q, k, v, s in zip(qs, ks, vs, starts)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_gather_reads_only_the_longest_context():
    cache = torch.arange(2 * 6 * BS * H * D, dtype=torch.float32).view(2, 6, BS, H, D)
    keys, values = gather_kv(cache, torch.tensor([[4, 1], [2, 0]]), num_slots=6)
    assert keys.shape == values.shape == (2, H, 6, D)
    torch.testing.assert_close(keys[0, :, :BS], cache[0, 4].transpose(0, 1))
    torch.testing.assert_close(values[1, :, BS:], cache[1, 0, :2].transpose(0, 1))
