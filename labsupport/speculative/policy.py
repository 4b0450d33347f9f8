"""How many tokens to draft at each batch size: speculation pays when the machine is idle.

Speculation trades extra target compute (verifying γ or a tree of tokens, most rejected)
for fewer sequential steps. At batch 1 a decode step leaves the hardware idle, so the extra
tokens are almost free; at a large batch every step is already busy and the rejected tokens
cost real time — the speed-up falls below 1. vLLM's *dynamic speculative decoding* therefore
takes a schedule, ``num_speculative_tokens_per_batch_size = [[start_bs, end_bs, K], …]``: a
running batch of ``start_bs … end_bs`` sequences drafts ``K`` tokens per round, ``K = 0`` meaning
no drafts (``[[1, 64, 3], [65, 128, 1], [129, 512, 0]]``). :class:`SpecPolicy` is that schedule;
:func:`policy_from_measurements` writes one from a measured sweep of speed-up by batch size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..validation import check_int, is_int

__all__ = ["MAX_BATCH", "SpecPolicy", "break_even_batch", "policy_from_measurements"]

MAX_BATCH = 1024
"""The end of a schedule's last range when a sweep leaves it open ("and every larger batch")."""


@dataclass
class SpecPolicy:
    """γ by batch size, in vLLM's form (``speculative_config["num_speculative_tokens_per_batch_size"]``).

    Args:
        num_speculative_tokens_per_batch_size: ``[[start_bs, end_bs, K], …]``, ranges of running-batch
            sizes (both ends included, ``1 ≤ start_bs ≤ end_bs``, no overlaps) and the tokens ``K ≥ 0``
            to draft there (``0``: a plain decoding round). A batch size in no range drafts the
            proposer's own γ.

    Raises:
        TypeError / ValueError: a range that is not three integers, ``start_bs`` < 1, ``end_bs`` < ``start_bs``,
            ``K`` < 0, or two ranges that overlap.
    """

    num_speculative_tokens_per_batch_size: Sequence[Sequence[int]]

    def __post_init__(self):
        name = "num_speculative_tokens_per_batch_size"
        ranges = self.num_speculative_tokens_per_batch_size
        if isinstance(ranges, (str, bytes)) or not isinstance(ranges, Sequence):
            raise TypeError(f"{name} must be a list of [start_bs, end_bs, K], got {ranges!r}")
        out = []
        for r in ranges:
            if isinstance(r, (str, bytes)) or not isinstance(r, Sequence) or len(r) != 3 or not all(map(is_int, r)):
                raise TypeError(f"{name} must hold [start_bs, end_bs, K] triples of integers, got {r!r}")
            start = check_int(f"{name} start_bs", r[0], 1)
            end = check_int(f"{name} end_bs", r[1], start)
            out.append((start, end, check_int(f"{name} K", r[2], 0)))
        out.sort()
        for (a0, a1, _), (b0, b1, _) in zip(out, out[1:]):
            if b0 <= a1:
                raise ValueError(f"{name} ranges must not overlap, got [{a0}, {a1}] and [{b0}, {b1}]")
        self.num_speculative_tokens_per_batch_size = [list(r) for r in out]

    def num_speculative_tokens(self, batch_size: int, default: int) -> int:
        """Tokens to draft per sequence in a round of ``batch_size`` running sequences (``default``,
        the proposer's γ, for a batch size in no range)."""
        for start, end, k in self.num_speculative_tokens_per_batch_size:
            if start <= batch_size <= end:
                return k
        return default

    def speculate(self, batch_size: int) -> bool:
        """True when a round with ``batch_size`` sequences drafts at all."""
        return self.num_speculative_tokens(batch_size, 1) > 0


def break_even_batch(speedups: Mapping[int, float], threshold: float = 1.0) -> int | None:
    """The smallest measured batch size whose speed-up is below ``threshold`` (None: it always pays).

    ``break_even_batch({1: 1.6, 2: 1.3, 4: 1.02, 8: 0.8}) == 8``.
    """
    for batch in sorted(speedups):
        if speedups[batch] < threshold:
            return batch
    return None


def policy_from_measurements(speedups: Mapping[int, float], num_speculative_tokens: int,
                             threshold: float = 1.0) -> SpecPolicy:
    """The schedule a sweep asks for: draft ``num_speculative_tokens`` from batch 1 up to the largest
    measured batch before the first one below ``threshold``, and nothing from that one on.

    ``policy_from_measurements({1: 1.6, 2: 1.3, 4: 0.9}, 3)`` → ``[[1, 2, 3], [3, 1024, 0]]`` (batch 3,
    between the last size that paid and the first that lost, drafts nothing: it was not seen to pay).

    Raises:
        TypeError / ValueError: ``num_speculative_tokens`` not an integer ≥ 1.
    """
    gamma = check_int("num_speculative_tokens", num_speculative_tokens, 1)
    stop = break_even_batch(speedups, threshold)
    if stop is None:
        return SpecPolicy([[1, MAX_BATCH, gamma]])
    paying = max((b for b in speedups if b < stop), default=0)
    if paying == 0:
        return SpecPolicy([[1, MAX_BATCH, 0]])
    return SpecPolicy([[1, paying, gamma], [paying + 1, MAX_BATCH, 0]])
