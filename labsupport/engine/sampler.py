"""The engine's sampler: one token for each sequence of a step, in as few batched calls as possible."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ..sampling import SamplingParams, greedy_ids, sample


class SampleRow(NamedTuple):
    """What the sampler needs of one sequence: which logits row it reads, its settings and generator,
    its token ids so far and where its output starts (penalties, ``min_tokens``), and the end ids."""

    row: int
    params: SamplingParams
    generator: torch.Generator | None
    token_ids: list[int]
    prompt_len: int
    end_ids: frozenset[int]


def sample_rows(logits: torch.Tensor, rows: Sequence[SampleRow],
                allowed: Sequence[torch.Tensor | None] | None = None) -> list[int]:
    """One token per row: every plain-greedy row in one arg-max, and the rows that share the same
    settings and the same generator in one :func:`~labsupport.sampling.sample` call.

    Args:
        logits: ``(B, vocab)`` float32, one row per scheduled sequence.
        rows: a :class:`SampleRow` for each sequence to sample (several may read the same logits
            row: the samples of a request with ``n > 1``).
        allowed: per entry of ``rows``, a ``(vocab,)`` bool grammar mask or ``None``
            (structured output); all masks of the step are applied in one masked fill.

    Returns:
        the token ids, in the order of ``rows``.
    """
    if not rows:
        return []
    index = [r.row for r in rows]                      # which logits row each entry reads
    no_masks = allowed is None or all(m is None for m in allowed)
    if no_masks and all(r.params.is_plain_greedy for r in rows):   # the common fast path: one arg-max, one list
        picked = logits if index == list(range(logits.shape[0])) else logits[index]
        return greedy_ids(picked).tolist()
    if allowed is not None and any(m is not None for m in allowed):
        from ..structured import apply_structured_mask
        logits = logits[index]                         # one row per entry: each has its own mask
        mask = torch.ones_like(logits, dtype=torch.bool)
        for j, m in enumerate(allowed):
            if m is not None:
                mask[j] = m
        logits = apply_structured_mask(logits, mask)
        index = list(range(len(rows)))
    tokens = [0] * len(rows)
    groups: dict[tuple, list[int]] = {}
    for j, r in enumerate(rows):
        key = ("greedy",) if r.params.is_plain_greedy else (r.params, id(r.generator), r.end_ids)
        groups.setdefault(key, []).append(j)
    for key, members in groups.items():
        picked = logits[[index[j] for j in members]]
        if key == ("greedy",):
            ids = greedy_ids(picked).tolist()
        else:
            first = rows[members[0]]
            ids = sample(picked, first.params, first.generator, [rows[j].token_ids for j in members],
                         prompt_lens=[rows[j].prompt_len for j in members], end_ids=first.end_ids).tolist()
        for j, t in zip(members, ids):
            tokens[j] = int(t)
    return tokens
