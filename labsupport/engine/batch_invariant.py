"""Batch-invariant mode: a request's logits bit-identical alone and in any batch (vLLM: ``VLLM_BATCH_INVARIANT=1``).

Float addition is not associative, so a sum's last bits depend on the order its terms are added
in — and a fast kernel picks that order from the *shape* it is given. A matrix product over
``M`` rows may take another code path at ``M = 4`` than at ``M = 1`` (measured on this package's
CPU build: a row's result moves by about 1e-6); attention over a padded batch reduces over the
longest context of the batch, not the row's own. So the same request gets different logits
depending on what else is in its step, and a near-tie between two tokens can flip.

The mode fixes each reduction's order by construction, so that a row's arithmetic depends on that
row alone:

* **matrix products** (:func:`tiled_matmul`): always the one ``x W`` kernel (no per-machine kernel
  choice), run on tiles of exactly :data:`TILE_ROWS` rows, the last tile padded with zeros: every
  call has the same shape, and a row's sums never see the other rows of its tile;
* **attention** (:func:`attention`): each new token attends alone, over exactly the keys it may
  see (its own context, in position order) — the same arithmetic whether its sequence is
  prefilling, decoding, chunked, served from the prefix cache or batched with others;
* the rest of a forward (layer norm, GELU, residual adds, per-row softmax) already works row by row.

The cost is speed: padded tiles compute rows that are thrown away, and attention runs one token
at a time (measured in chapter 12). int8 weights (``quantization="int8"``) are not covered: their
activation scale is one per call, over every row of the batch.
"""

from __future__ import annotations

import torch

TILE_ROWS = 8
"""Rows of every matrix product in batch-invariant mode: fewer rows are padded with zeros."""


def check_settings(batch_invariant: bool, quantization: str | None, attention_backend: str | None) -> bool:
    """``batch_invariant``, checked against the settings it cannot run with.

    Raises:
        TypeError: not a bool. ValueError: with ``quantization`` or ``attention_backend="CPU_ATTN"``.
    """
    if not isinstance(batch_invariant, bool):
        raise TypeError(f"batch_invariant must be a bool, got {batch_invariant!r}")
    if batch_invariant and (quantization is not None or attention_backend == "CPU_ATTN"):
        raise ValueError("batch_invariant=True runs its own fixed-order matmuls and attention: it takes "
                         f"quantization=None and attention_backend None or 'TORCH_SDPA', got quantization="
                         f"{quantization!r}, attention_backend={attention_backend!r}")
    return batch_invariant


def tiled_matmul(x: torch.Tensor, w_io: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W + b`` computed on tiles of exactly :data:`TILE_ROWS` rows (the last one zero-padded), so
    that every product has one shape and a row's result does not depend on how many rows came with it.

    Args:
        x: ``(M, in)``. w_io: ``(in, out)``, the ``x W`` layout. bias: ``(out,)`` or ``None``.

    Returns:
        ``(M, out)``.
    """
    m = x.shape[0]
    out = x.new_empty(m, w_io.shape[1])
    for start in range(0, m, TILE_ROWS):
        rows = x[start:start + TILE_ROWS]
        if rows.shape[0] < TILE_ROWS:                                   # pad the last tile with zero rows
            rows = torch.cat([rows, rows.new_zeros(TILE_ROWS - rows.shape[0], rows.shape[1])])
        y = rows @ w_io if bias is None else torch.addmm(bias, rows, w_io)
        out[start:start + TILE_ROWS] = y[:min(TILE_ROWS, m - start)]
    return out


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, meta, scale: float) -> torch.Tensor:
    """Each new token's attention computed alone over exactly the keys it may see.

    Args:
        q: ``(N, H, D)`` queries of the new tokens (flat, sequence after sequence).
        keys, values: ``(B, H, C, D)`` each sequence's gathered cache (the new tokens' K/V written).
        meta: the step's :class:`~labsupport.engine.attention.AttentionMetadata` (a token tree's
            rows see the keys its mask leaves visible; any other row sees its positions ``≤ p``).
        scale: score scale.

    Returns:
        ``(N, H·D)``.
    """
    n, heads, dim = q.shape
    out = q.new_empty(n, heads * dim)
    row = 0
    for b, (q_len, ctx) in enumerate(zip(meta.query_lens, meta.context_lens)):
        start = ctx - q_len
        for i in range(q_len):
            if meta.tree and meta.mask is not None:                      # a tree token: prefix + its ancestors
                visible = torch.nonzero(meta.mask[b, 0, i, :ctx] == 0).flatten()
                k, v = keys[b].index_select(1, visible), values[b].index_select(1, visible)
            else:                                                        # causal: positions 0 … start + i
                k, v = keys[b, :, :start + i + 1], values[b, :, :start + i + 1]
            k, v = k.contiguous(), v.contiguous()                        # one layout, whatever the batch
            scores = torch.matmul(q[row].unsqueeze(1), k.transpose(1, 2)) * scale       # (H, 1, L)
            out[row] = torch.matmul(torch.softmax(scores, dim=-1), v).reshape(-1)      # (H, 1, D) → (H·D,)
            row += 1
    return out
