"""The engine's sampler: one token for each sequence of a step, in as few batched calls as possible."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..sampling import SamplingParams, sample


def sample_rows(logits: torch.Tensor,
                rows: Sequence[tuple[int, SamplingParams, torch.Generator | None, list[int]]]) -> list[int]:
    """One token per row: every plain-greedy row in one arg-max, and the rows that share the same
    settings and the same generator in one :func:`~labsupport.sampling.sample` call.

    Args:
        logits: ``(B, vocab)`` float32, one row per scheduled sequence.
        rows: ``(logits row, params, generator, token ids so far)`` for each sequence to sample
            (several entries may read the same row: the samples of a request with ``n > 1``).

    Returns:
        the token ids, in the order of ``rows``.
    """
    tokens = [0] * len(rows)
    groups: dict[tuple, list[int]] = {}
    for j, (_, params, generator, _) in enumerate(rows):
        key = ("greedy",) if params.is_plain_greedy else (params, id(generator))
        groups.setdefault(key, []).append(j)
    for key, members in groups.items():
        picked = logits[[rows[j][0] for j in members]]
        if key == ("greedy",):
            ids = picked.argmax(dim=-1).tolist()
        else:
            _, params, generator, _ = rows[members[0]]
            ids = sample(picked, params, generator, [rows[j][3] for j in members]).tolist()
        for j, t in zip(members, ids):
            tokens[j] = int(t)
    return tokens
