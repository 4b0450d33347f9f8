"""What a speculative run records: one :class:`RoundRecord` per round, and :class:`SpecStats` over them
(acceptance per draft position, α, tokens per target forward)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .theory import expected_tokens_per_round


@dataclass
class RoundRecord:
    """One draft-verify round.

    Attributes:
        position: sequence length when the round started.
        draft_tokens: the proposal (k ≤ γ tokens; for a tree, the accepted path and the first
            rejected child).
        num_accepted: n, accepted prefix length.
        next_token: the target's own token (replacement at position n, or bonus when n = k).
        bonus: True when all k drafts were accepted (and k ≥ 1).
        emitted: tokens actually appended (stopping rules may cut the block).
        accept_prob: ``min(1, p/q)`` per draft token.
        overlap: ``Σ_x min(p(x), q(x))`` per draft position (= 1 − TV(p, q): the expected
            acceptance there).
        target_argmax: arg-max of the target's raw logits at each of the k+1 positions.
    """

    position: int
    draft_tokens: list[int]
    num_accepted: int
    next_token: int
    bonus: bool
    emitted: list[int]
    accept_prob: list[float]
    overlap: list[float]
    target_argmax: list[int]


@dataclass
class SpecStats:
    """Statistics of a speculative run.

    ``num_speculative_tokens``: γ, the most draft tokens along one path of a round (the
    proposer's). ``reached[i]``: rounds in which draft position i was verified (all earlier ones
    accepted); ``accepted[i]``: those in which it was accepted. Times in seconds.
    """

    num_speculative_tokens: int
    rounds: int = 0
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    proposed: int = 0
    produced: int = 0              # Σ (n + 1) over rounds, before the stopping rules cut
    overlap_sum: float = 0.0
    draft_forwards: int = 0
    draft_seconds: float = 0.0
    target_forwards: int = 0       # verification forwards (= rounds)
    target_seconds: float = 0.0
    prefill_seconds: float = 0.0
    draft_lengths: dict[int, int] = field(default_factory=dict)    # k → rounds that drafted k tokens

    def __post_init__(self) -> None:
        self.reached = self.reached or [0] * self.num_speculative_tokens
        self.accepted = self.accepted or [0] * self.num_speculative_tokens

    def add(self, r: RoundRecord) -> None:
        """Count one verified round."""
        k = len(r.draft_tokens)
        self.rounds += 1
        self.draft_lengths[k] = self.draft_lengths.get(k, 0) + 1
        self.proposed += k
        self.produced += r.num_accepted + 1
        for i in range(min(k, r.num_accepted + 1)):
            self.reached[i] += 1
            self.accepted[i] += int(i < r.num_accepted)
        self.overlap_sum += sum(r.overlap[:min(k, r.num_accepted + 1)])

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(accept position i | position i reached), NaN where never reached."""
        return [a / n if n else float("nan") for a, n in zip(self.accepted, self.reached)]

    @property
    def alpha(self) -> float:
        """Measured acceptance rate α = accepted / verified draft tokens (NaN if none)."""
        n = sum(self.reached)
        return sum(self.accepted) / n if n else float("nan")

    @property
    def mean_overlap(self) -> float:
        """Mean ``Σ min(p, q)`` over verified positions: the expected α (Leviathan et al. Section 3.1)."""
        n = sum(self.reached)
        return self.overlap_sum / n if n else float("nan")

    @property
    def tokens_per_round(self) -> float:
        """Measured tokens per target (verification) forward."""
        return self.produced / self.rounds if self.rounds else float("nan")

    @property
    def mean_draft_length(self) -> float:
        return self.proposed / self.rounds if self.rounds else float("nan")

    @property
    def theory_tokens_per_round(self) -> float:
        """``(1 − α^(k+1))/(1 − α)`` at the measured α, averaged over the rounds' draft lengths k
        (k = γ except near ``max_new_tokens``, or when n-gram lookup finds fewer tokens)."""
        if self.rounds == 0:
            return float("nan")
        a = 0.0 if math.isnan(self.alpha) else self.alpha
        return sum(expected_tokens_per_round(a, k) * n for k, n in self.draft_lengths.items()) / self.rounds

