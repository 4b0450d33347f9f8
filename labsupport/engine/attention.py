"""Paged attention by gather (PagedAttention, Kwon et al., 2023).

One forward step runs a batch that mixes *prefill* rows (many new tokens of one sequence)
and *decode* rows (one new token) of different lengths. The new tokens of all sequences are
packed into one flat list of ``N`` tokens; the linear layers run on that list. Attention
needs more: each new token's K/V is written into its slot of the paged cache (the *slot
mapping*), then each sequence reads back all of its K/V through its *block table*:

    write   cache[slot_mapping[i]] ← k_i, v_i                 for every new token i
    gather  K_b = cache[block_table_b]  (whole blocks)        for every sequence b
    attend  softmax(q K_bᵀ · scale + causal mask) V_b

Tree verification (SpecInfer, Miao et al. 2024; Medusa, Cai et al. 2024) feeds a *token tree*
as one sequence's new tokens: ``tree_parents`` gives each new token's parent (an index among
the new tokens, ``-1`` = the cached prefix). Token ``i`` is stored in slot ``start + i`` but has
position id ``start + depth(i)`` and attends to the prefix and to its own ancestors only.

Layout. One layer's cache is ``(2, num_blocks, block_size, H, D)``: K and V, then blocks, and
inside a block the slots, each holding all heads of one token (``H·D`` numbers in a row), so
writing a new token is one row per slot. The gather copies each sequence's blocks (one
``index_select``, only up to the longest context) into ``(B, C, H, D)`` and *views* it as
``(B, H, C, D)`` by swapping two strides; ``scaled_dot_product_attention`` takes that strided
tensor without another copy. This is the ``TORCH_SDPA`` backend, the reference; a kernel such
as vLLM's reads the blocks in place instead of copying them (the ``CPU_ATTN`` backend,
:mod:`labsupport.engine.native_attention`, checked against this module). The mask is built once per step and only when some query must not see some key
(a prompt's causal triangle, contexts of different lengths, a token tree). Shapes: ``N`` new
tokens, ``B`` sequences, ``Q`` most new tokens of one sequence, ``C`` longest context (key
slots per sequence), ``H`` heads, ``D`` head dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kv import blocks_needed
from .batch_invariant import attention as batch_invariant_attention
from .block_manager import slot_mapping_of


@dataclass
class AttentionMetadata:
    """Everything a paged-attention layer needs for one step (built once, used by every layer).

    Attributes:
        positions: ``(N,)`` position id of each new token.
        slot_mapping: ``(N,)`` flat cache slot of each new token: ``table[p // bs]·bs + p % bs``.
        block_tables: ``(B, max_blocks)`` physical blocks of each sequence, padded with block 0,
            ``max_blocks = ⌈C / block_size⌉`` (only the blocks the longest context needs).
        mask: ``(B, 1, Q, C)`` (``(B, H, 1, C)`` in a decode-only step) additive mask, 0 where query ``q`` of sequence ``b`` may attend to
            key slot ``k`` (``k ≤ position(q)``: causal; later slots hold other data or nothing),
            ``-inf`` elsewhere; built once per step, shared by every layer. ``None`` when every
            query sees every one of the ``C`` keys (one new token per sequence and all contexts
            of length ``C``: a single request decoding, or a batch at equal lengths).
        query_index: ``(N,)`` row of each new token in the padded ``(B·Q)`` query layout, or
            ``None`` when every sequence has the same number of new tokens (the flat list is
            already ``(B, Q)``: pure decode, or one sequence's prefill).
        query_lens: new tokens per sequence (Python list, length B).
        context_lens: tokens each sequence attends over after this step, ``start + query_len``
            (Python list, length B); ``C = max(context_lens)``.
        lens: ``(2, B)`` int64, ``query_lens`` and ``context_lens`` as one tensor (what the in-place
            kernel of :mod:`labsupport.engine.native_attention` reads).
        tree: some sequence's new tokens form a token tree (``tree_parents`` given).
        needs_mask: some query must not see some key (then ``mask`` is set, unless built with ``mask=False``
            for the in-place kernel, which :func:`paged_attention` refuses).

    With a token tree, ``positions`` are ``start + depth`` while ``slot_mapping`` follows the
    order of the new tokens (``start + i``), and ``mask`` lets a tree token see only the
    prefix and its ancestors.
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    mask: torch.Tensor | None
    query_index: torch.Tensor | None
    query_lens: list[int]
    context_lens: list[int]
    lens: torch.Tensor
    tree: bool = False
    needs_mask: bool = False

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_context_len(self) -> int:
        return max(self.context_lens)


def build_metadata(query_lens: Sequence[int], start_positions: Sequence[int],
                   block_tables: Sequence[Sequence[int]], block_size: int,
                   device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                   tree_parents: Sequence[Sequence[int] | None] | None = None,
                   num_heads: int = 1, *, mask: bool = True) -> AttentionMetadata:
    """Build the step's :class:`AttentionMetadata` from per-sequence lists.

    Positions and slots are computed as Python lists and turned into tensors once: a decode
    step is a handful of numbers, and on a small model every extra tensor op costs more than
    the arithmetic it does.

    Args:
        query_lens: new tokens of each sequence this step (prefill chunk length, or 1 to decode).
        start_positions: position of each sequence's first new token (= tokens already cached).
        block_tables: each sequence's physical block ids; they must cover
            ``start + query_len`` slots.
        block_size: token slots per block.
        device, dtype: of the tensors (``dtype`` is the additive mask's, the model's dtype).
        tree_parents: per sequence ``None`` (a causal chain) or the parent of each new token
            (``-1`` or an earlier index ``< i``; see :func:`tree_ancestors`).
        num_heads: heads of the model; a decode-only step's mask is copied out per head
            (``(B, H, 1, C)``, a few numbers) because SDPA on CPU reads a mask broadcast over the
            heads about twice as slowly as the attention itself costs.
        mask: build the additive mask where one is needed; ``False`` for the in-place kernel
            (:mod:`labsupport.engine.native_attention`), which follows the causal rule itself.

    Raises:
        ValueError: lists of different lengths, an empty batch, a query length < 1, a negative
            start position or block id, a block table too short for its tokens, or a bad parent list.
    """
    if not (len(query_lens) == len(start_positions) == len(block_tables)) or not query_lens:
        raise ValueError("query_lens, start_positions and block_tables must be non-empty lists of one length, "
                         f"got {len(query_lens)}, {len(start_positions)}, {len(block_tables)}")
    ctx_lens = [s + q for s, q in zip(start_positions, query_lens)]
    for b, (q, ctx, table) in enumerate(zip(query_lens, ctx_lens, block_tables)):
        if q < 1:
            raise ValueError(f"query_lens must be >= 1, got {q} for sequence {b}")
        if start_positions[b] < 0:
            raise ValueError(f"start_positions must be >= 0, got {start_positions[b]} for sequence {b}")
        if len(table) * block_size < ctx:
            raise ValueError(f"block table of sequence {b} holds {len(table) * block_size} slots, needs {ctx}")
        if table and min(table) < 0:
            raise ValueError(f"block tables must hold block ids >= 0, got {min(table)} for sequence {b}")
    trees = tree_parents is not None and any(p is not None for p in tree_parents)
    if trees and len(tree_parents) != len(query_lens):
        raise ValueError(f"tree_parents must have one entry per sequence ({len(query_lens)}), got {len(tree_parents)}")
    num_seqs, max_q, max_ctx = len(query_lens), max(query_lens), max(ctx_lens)
    max_blocks = blocks_needed(max_ctx, block_size)
    padded = [list(t[:max_blocks]) + [0] * (max_blocks - min(len(t), max_blocks)) for t in block_tables]
    slots = [slot for t, s, q in zip(block_tables, start_positions, query_lens)
             for slot in slot_mapping_of(t, range(s, s + q), block_size)]
    positions = [p for s, q in zip(start_positions, query_lens) for p in range(s, s + q)]
    ancestors: list[tuple[int, torch.Tensor]] = []                                 # (sequence, (q, q) bool)
    if trees:
        first = 0
        for b, parents in enumerate(tree_parents):
            q, start = query_lens[b], start_positions[b]
            if parents is not None:
                if len(parents) != q:
                    raise ValueError(f"tree_parents[{b}] must have {q} entries (one per new token), got {len(parents)}")
                anc = tree_ancestors(parents)                                      # (q, q) bool
                positions[first:first + q] = (start + anc.sum(1) - 1).tolist()     # start + depth
                ancestors.append((b, anc))
            first += q
    attn_mask = None
    needs_mask = max_q > 1 or min(ctx_lens) < max_ctx               # some query must not see some key
    if mask and needs_mask:
        starts = torch.tensor(start_positions, dtype=torch.long, device=device)    # (B,)
        query_pos = starts[:, None] + torch.arange(max_q, device=device)           # (B, Q)
        key_pos = torch.arange(max_ctx, device=device)                             # (C,)
        visible = (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)   # (B, 1, Q, C)
        for b, anc in ancestors:
            q, start = query_lens[b], start_positions[b]
            visible[b, 0, :q, start:start + q] = anc.to(device)                    # prefix stays visible
        attn_mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, float("-inf"))
        if max_q == 1 and num_heads > 1:                           # decode: one mask row per head (see num_heads)
            attn_mask = attn_mask.expand(num_seqs, num_heads, 1, max_ctx).contiguous()
    query_index = None
    if min(query_lens) < max_q:                                    # ragged: scatter into (B, Q) rows
        query_index = torch.tensor([b * max_q + i for b, q in enumerate(query_lens) for i in range(q)],
                                   dtype=torch.long, device=device)
    return AttentionMetadata(positions=torch.tensor(positions, dtype=torch.long, device=device),
                             slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
                             block_tables=torch.tensor(padded, dtype=torch.long, device=device),
                             mask=attn_mask, query_index=query_index, query_lens=list(query_lens),
                             context_lens=ctx_lens,
                             lens=torch.tensor([list(query_lens), ctx_lens], dtype=torch.long, device=device),
                             tree=bool(ancestors), needs_mask=needs_mask)


def check_metadata(meta: AttentionMetadata, num_blocks: int, block_size: int,
                   device: torch.device | str = "cpu") -> None:
    """Check a caller's metadata against a pool of ``num_blocks`` blocks of ``block_size`` slots before a
    kernel follows it (:func:`build_metadata` makes consistent metadata; this is for metadata from elsewhere).

    Raises:
        ValueError: a tensor not int64 on ``device`` of its shape, or not contiguous; ``lens`` that disagree
            with ``query_lens`` / ``context_lens`` (or a context shorter than its queries); tables too short
            for the longest context; a block id or slot outside the pool.
    """
    b, n = meta.num_seqs, sum(meta.query_lens)
    tables, slots, lens = meta.block_tables, meta.slot_mapping, meta.lens
    for name, t, shape in (("meta.block_tables", tables, (b, tables.shape[-1])), ("meta.slot_mapping", slots, (n,)),
                           ("meta.lens", lens, (2, b))):
        if t.dtype != torch.int64 or t.device.type != torch.device(device).type or not t.is_contiguous() or \
                tuple(t.shape) != shape:
            raise ValueError(f"{name} must be a contiguous int64 tensor on {torch.device(device).type} of shape "
                             f"{shape}, got {t.dtype} {tuple(t.shape)} on {t.device}")
    if lens.tolist() != [list(meta.query_lens), list(meta.context_lens)] or \
            any(q < 1 or c < q for q, c in zip(meta.query_lens, meta.context_lens)):
        raise ValueError("meta.lens must hold query_lens and context_lens (each context_len >= its query_len >= 1), "
                         f"got {lens.tolist()}")
    lo_block, hi_block = (int(tables.min()), int(tables.max())) if tables.numel() else (0, 0)
    lo_slot, hi_slot = int(slots.min()), int(slots.max())
    if lo_block < 0 or hi_block >= num_blocks or lo_slot < 0 or hi_slot >= num_blocks * block_size or \
            tables.shape[1] * block_size < meta.max_context_len:
        raise ValueError(f"meta must address blocks in [0, {num_blocks}) and slots in [0, {num_blocks * block_size}) "
                         f"with room for {meta.max_context_len} keys per table, got blocks {lo_block}..{hi_block}, "
                         f"slots {lo_slot}..{hi_slot}, {tables.shape[1]} blocks per table of {block_size} slots")


def tree_ancestors(parents: Sequence[int]) -> torch.Tensor:
    """Ancestor-or-self matrix of a token tree: ``A[i, j]`` is True iff ``j`` is ``i`` or above it.

    Args:
        parents: ``parents[i]`` is the parent of node ``i`` — ``-1`` (the cached prefix) or an
            index ``< i`` (parents come first, so one pass fills the matrix).

    Returns:
        ``(q, q)`` bool tensor; row sums − 1 are the depths.

    Raises:
        ValueError: a parent that is not ``-1`` or an earlier index.
    """
    q = len(parents)
    anc = torch.zeros(q, q, dtype=torch.bool)
    for i, p in enumerate(parents):
        p = int(p)
        if not -1 <= p < i:
            raise ValueError(f"tree_parents[{i}] must be -1 or an earlier index in [0, {i}), got {p}")
        if p >= 0:
            anc[i] = anc[p]
        anc[i, i] = True
    return anc


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store new keys/values in their slots.

    Args:
        kv_cache: one layer's cache ``(2, num_blocks, block_size, H, D)`` (0 = K, 1 = V), changed in place.
        k, v: ``(N, H, D)``, in the cache's dtype.
        slot_mapping: ``(N,)`` flat slots.
    """
    _, num_blocks, block_size, heads, dim = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, heads, dim)
    flat[0].index_copy_(0, slot_mapping, k)
    flat[1].index_copy_(0, slot_mapping, v)


def gather_kv(kv_cache: torch.Tensor, block_tables: torch.Tensor, num_slots: int | None = None,
              workspace: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's keys and values, read whole blocks at a time through its block table.

    One ``index_select`` copies the blocks (the only copy); the rest are views: the result
    has SDPA's ``(B, H, K, D)`` shape with strides that step over the heads of a slot, which
    ``scaled_dot_product_attention`` reads as they are (a ``.contiguous()`` would only add a
    second copy).

    Args:
        kv_cache: one layer's cache ``(2, num_blocks, block_size, H, D)``.
        block_tables: ``(B, max_blocks)`` block ids.
        num_slots: keep only the first ``num_slots`` key slots (the longest context); default all.
        workspace: a flat tensor of the cache's dtype with room for the copy, reused from step to
            step and layer to layer (the runner keeps one); ``None`` allocates it. A fresh buffer of a
            few hundred KB costs more than the copy: the allocator maps new pages each time (measured
            in the runner: 23–72 µs a layer for 200 KB, against 4–5 µs into a reused buffer).

    Returns:
        ``K, V`` of shape ``(B, H, K, D)``, ``K = num_slots`` or ``max_blocks·block_size``;
        slots past a sequence's length hold other data and must be masked.
    """
    _, _, block_size, heads, dim = kv_cache.shape
    num_seqs, max_blocks = block_tables.shape
    index = block_tables.reshape(-1)
    if workspace is None:
        kv = kv_cache.index_select(1, index)                            # (2, B·max_blocks, bs, H, D): the copy
    else:
        kv = workspace[:2 * index.numel() * block_size * heads * dim].view(2, index.numel(), block_size, heads, dim)
        torch.index_select(kv_cache, 1, index, out=kv)
    kv = kv.view(2, num_seqs, max_blocks * block_size, heads, dim)[:, :, :num_slots].transpose(2, 3)  # (2, B, H, K, D)
    return kv[0], kv[1]


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float, kv_scales: torch.Tensor | None = None,
                    kv_cache_dtype: str = "auto", workspace: torch.Tensor | None = None,
                    batch_invariant: bool = False) -> torch.Tensor:
    """Attention of the new tokens over everything their sequence has cached, in one call.

    Args:
        q, k, v: ``(N, H, D)`` projections of the new tokens (flat, sequence after sequence).
        kv_cache: one layer's paged cache ``(2, num_blocks, block_size, H, D)``; the new K/V are
            written into it first.
        meta: the step's :class:`AttentionMetadata`.
        scale: score scale, ``1/√D`` for GPT-2.
        kv_scales, kv_cache_dtype: an 8-bit cache's scales ``(2, num_blocks, block_size, H)`` and
            its dtype (:mod:`labsupport.quant.kv`); ``None`` for a cache in the model's dtype.
        workspace: room for the gathered K/V (:func:`gather_kv`), large enough for this step.
        batch_invariant: each token attends alone over exactly the keys it may see
            (:func:`labsupport.engine.batch_invariant.attention`) instead of one padded SDPA call.

    Returns:
        ``(N, H·D)`` attention output of each new token, heads concatenated.
    """
    _, heads, dim = q.shape
    if meta.mask is None and meta.needs_mask:
        raise ValueError("meta was built with mask=False (for the in-place kernel), but this step needs a mask: "
                         "build it with mask=True")
    if kv_scales is None:
        write_kv(kv_cache, k, v, meta.slot_mapping)
        keys, values = gather_kv(kv_cache, meta.block_tables, meta.max_context_len, workspace)   # (B, H, C, D) each
    else:                                                              # 8-bit KV: quantise in, dequantise out
        from ..quant.kv import gather_dequantized, write_quantized
        write_quantized(kv_cache, kv_scales, k, v, meta.slot_mapping, kv_cache_dtype)
        keys, values = gather_dequantized(kv_cache, kv_scales, meta.block_tables, meta.max_context_len,
                                          kv_cache_dtype, q.dtype)
    if batch_invariant:
        return batch_invariant_attention(q, keys, values, meta, scale)
    num_seqs, max_q = meta.num_seqs, meta.max_query_len
    if meta.query_index is None:                                       # every sequence has Q rows already
        queries = q.view(num_seqs, max_q, heads, dim)
    else:                                                              # scatter into (B, Q) rows
        queries = q.new_zeros(num_seqs * max_q, heads, dim).index_copy_(0, meta.query_index, q)
        queries = queries.view(num_seqs, max_q, heads, dim)
    out = F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values,
                                         attn_mask=meta.mask, scale=scale)          # (B, H, Q, D)
    out = out.transpose(1, 2).reshape(num_seqs * max_q, heads * dim)
    return out if meta.query_index is None else out.index_select(0, meta.query_index)
