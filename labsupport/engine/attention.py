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

The gather copies the blocks into a padded ``(B, H, K, D)`` tensor, which plain PyTorch
(``scaled_dot_product_attention``) can use; a CUDA kernel such as vLLM's reads the blocks in
place instead. Shapes: ``N`` new tokens, ``B`` sequences, ``Q`` most new tokens of one
sequence, ``K = max_blocks · block_size`` key slots per sequence, ``H`` heads, ``D`` head dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """Everything a paged-attention layer needs for one step (built once, used by every layer).

    Attributes:
        positions: ``(N,)`` position id of each new token.
        slot_mapping: ``(N,)`` flat cache slot of each new token: ``table[p // bs]·bs + p % bs``.
        block_tables: ``(B, max_blocks)`` physical blocks of each sequence, padded with block 0.
        mask: ``(B, 1, Q, K)`` additive mask, 0 where query ``q`` of sequence ``b`` may attend to
            key slot ``k`` (``k ≤ position(q)``: causal; later slots hold other data or nothing),
            ``-inf`` elsewhere. Built once per step, shared by every layer.
        query_index: ``(N,)`` row of each new token in the padded ``(B·Q)`` query layout, or
            ``None`` when every sequence has exactly one new token (pure decode: no padding).
        query_lens: new tokens per sequence (Python list, length B).

    With a token tree, ``positions`` are ``start + depth`` while ``slot_mapping`` follows the
    order of the new tokens (``start + i``), and ``mask`` lets a tree token see only the
    prefix and its ancestors.
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    mask: torch.Tensor
    query_index: torch.Tensor | None
    query_lens: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return self.mask.shape[2]


def build_metadata(query_lens: Sequence[int], start_positions: Sequence[int],
                   block_tables: Sequence[Sequence[int]], block_size: int,
                   device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                   tree_parents: Sequence[Sequence[int] | None] | None = None) -> AttentionMetadata:
    """Build the step's :class:`AttentionMetadata` from per-sequence lists (no per-token loop).

    Args:
        query_lens: new tokens of each sequence this step (prefill chunk length, or 1 to decode).
        start_positions: position of each sequence's first new token (= tokens already cached).
        block_tables: each sequence's physical block ids; they must cover
            ``start + query_len`` slots.
        block_size: token slots per block.
        device, dtype: of the tensors (``dtype`` is the additive mask's, the model's dtype).
        tree_parents: per sequence ``None`` (a causal chain) or the parent of each new token
            (``-1`` or an earlier index ``< i``; see :func:`tree_ancestors`).

    Raises:
        ValueError: lists of different lengths, an empty batch, a query length < 1, a negative
            start position, a block table too short for its tokens, or a bad parent list.
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
    num_seqs, max_q = len(query_lens), max(query_lens)
    max_blocks = -(-max(ctx_lens) // block_size)
    padded = [list(t[:max_blocks]) + [0] * (max_blocks - min(len(t), max_blocks)) for t in block_tables]
    tables = torch.tensor(padded, dtype=torch.long, device=device)                 # (B, max_blocks)
    starts = torch.tensor(start_positions, dtype=torch.long, device=device)        # (B,)
    if max_q == 1:                                                                 # decode only: N = B
        seq_of_token = torch.arange(num_seqs, device=device)
        positions = starts
    else:
        qlens = torch.tensor(query_lens, dtype=torch.long, device=device)          # (B,)
        seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), qlens)  # (N,)
        first_token = torch.cumsum(qlens, 0) - qlens                               # (B,) flat index
        offset = torch.arange(len(seq_of_token), device=device) - first_token[seq_of_token]  # (N,) 0..q-1
        positions = starts[seq_of_token] + offset                                  # (N,)
    slot_mapping = tables[seq_of_token, positions // block_size] * block_size + positions % block_size
    query_pos = starts[:, None] + torch.arange(max_q, device=device)               # (B, Q)
    key_pos = torch.arange(max_blocks * block_size, device=device)                 # (K,)
    visible = (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)       # (B, 1, Q, K)
    if tree_parents is not None and any(p is not None for p in tree_parents):
        if len(tree_parents) != num_seqs:
            raise ValueError(f"tree_parents must have one entry per sequence ({num_seqs}), got {len(tree_parents)}")
        positions = positions.clone()
        first = 0
        for b, parents in enumerate(tree_parents):
            q, start = query_lens[b], start_positions[b]
            if parents is not None:
                if len(parents) != q:
                    raise ValueError(f"tree_parents[{b}] must have {q} entries (one per new token), got {len(parents)}")
                anc = tree_ancestors(parents)                                      # (q, q) bool
                depth = anc.sum(1) - 1                                             # (q,)
                positions[first:first + q] = start + depth.to(device)
                visible[b, 0, :q, start:start + q] = anc.to(device)                # prefix stays visible
            first += q
    mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, float("-inf"))
    query_index = None if max_q == 1 else seq_of_token * max_q + offset
    return AttentionMetadata(positions=positions, slot_mapping=slot_mapping, block_tables=tables,
                             mask=mask, query_index=query_index, query_lens=list(query_lens))


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


def gather_kv(kv_cache: torch.Tensor, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's keys and values, read whole blocks at a time through its block table.

    Returns:
        ``K, V`` of shape ``(B, H, max_blocks·block_size, D)``; slots past a sequence's length
        hold other data and must be masked.
    """
    _, _, block_size, heads, dim = kv_cache.shape
    num_seqs, max_blocks = block_tables.shape
    kv = kv_cache.index_select(1, block_tables.reshape(-1))             # (2, B·max_blocks, bs, H, D)
    kv = kv.view(2, num_seqs, max_blocks * block_size, heads, dim).transpose(2, 3)   # (2, B, H, K, D)
    return kv[0], kv[1]


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Attention of the new tokens over everything their sequence has cached, in one call.

    Args:
        q, k, v: ``(N, H, D)`` projections of the new tokens (flat, sequence after sequence).
        kv_cache: one layer's paged cache ``(2, num_blocks, block_size, H, D)``; the new K/V are
            written into it first.
        meta: the step's :class:`AttentionMetadata`.
        scale: score scale, ``1/√D`` for GPT-2.

    Returns:
        ``(N, H·D)`` attention output of each new token, heads concatenated.
    """
    _, heads, dim = q.shape
    write_kv(kv_cache, k, v, meta.slot_mapping)
    keys, values = gather_kv(kv_cache, meta.block_tables)              # (B, H, K, D) each
    num_seqs, max_q = meta.num_seqs, meta.max_query_len
    if meta.query_index is None:                                       # decode only: one row each
        queries = q.view(num_seqs, 1, heads, dim)
    else:                                                              # scatter into (B, Q) rows
        queries = q.new_zeros(num_seqs * max_q, heads, dim).index_copy_(0, meta.query_index, q)
        queries = queries.view(num_seqs, max_q, heads, dim)
    out = F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values,
                                         attn_mask=meta.mask, scale=scale)          # (B, H, Q, D)
    out = out.transpose(1, 2).reshape(num_seqs * max_q, heads * dim)
    return out if meta.query_index is None else out.index_select(0, meta.query_index)
