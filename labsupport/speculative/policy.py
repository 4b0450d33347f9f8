"""When to switch speculation off: under load the batch already fills the machine.

Speculation trades extra target compute (verifying γ or a tree of tokens, most rejected)
for fewer sequential steps. At batch 1 a decode step leaves the hardware idle, so the extra
tokens are almost free; at a large batch every step is already busy and the rejected tokens
cost real time — the speed-up falls below 1. vLLM and SGLang therefore disable speculative
decoding above a batch size (vLLM's ``speculative_disable_by_batch_size``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..validation import check_int

__all__ = ["SpecPolicy", "break_even_batch", "policy_from_measurements"]


@dataclass
class SpecPolicy:
    """Draft only while the running batch holds at most ``max_batch_size`` sequences
    (vLLM: ``speculative_disable_by_batch_size = max_batch_size + 1``).

    Raises:
        TypeError / ValueError: ``max_batch_size`` not an integer ≥ 0.
    """

    max_batch_size: int = 4

    def __post_init__(self):
        self.max_batch_size = check_int("max_batch_size", self.max_batch_size, 0)

    def speculate(self, num_running: int) -> bool:
        """True when a round with ``num_running`` sequences should draft."""
        return num_running <= self.max_batch_size


def break_even_batch(speedups: Mapping[int, float], threshold: float = 1.0) -> int | None:
    """The smallest measured batch size whose speed-up is below ``threshold`` (None: it always pays).

    ``break_even_batch({1: 1.6, 2: 1.3, 4: 1.02, 8: 0.8}) == 8``.
    """
    for batch in sorted(speedups):
        if speedups[batch] < threshold:
            return batch
    return None


def policy_from_measurements(speedups: Mapping[int, float], threshold: float = 1.0) -> SpecPolicy:
    """A :class:`SpecPolicy` that drafts at every measured batch size that still paid."""
    paying = [b for b in sorted(speedups) if speedups[b] >= threshold]
    stop = break_even_batch(speedups, threshold)
    limit = max([b for b in paying if stop is None or b < stop], default=0)
    return SpecPolicy(limit)
