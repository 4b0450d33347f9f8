"""The expected-value theory of speculative decoding (Leviathan et al. 2023, Section 3; Chen et al. 2023).

If every draft token is accepted independently with probability α, a round that drafts γ
tokens accepts a geometric run of them (stopping at the first rejection) and always adds one
token of the target's own, so the target emits ``(1 − α^(γ+1)) / (1 − α)`` tokens per forward.
Dividing by the round's cost (γ draft steps of relative cost c, one verification of relative
cost v) gives the expected speed-up over plain decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..validation import check_int, check_real


def _alpha(alpha: float) -> float:
    return check_real("alpha", alpha, 0.0, 1.0)


def expected_accepted(alpha: float, gamma: int) -> float:
    """E[N], accepted draft tokens per round: ``Σ_{j=1..γ} α^j = α(1−α^γ)/(1−α)``
    (Leviathan et al. 2023, Section 3.3).

    Assumes every draft token is accepted independently with probability α.

    Raises:
        TypeError: α not a number or γ not an integer.
        ValueError: α outside [0, 1] or γ < 0.
    """
    a, g = _alpha(alpha), check_int("gamma", gamma, 0)
    return float(sum(a ** j for j in range(1, g + 1)))


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """Tokens emitted per target forward: ``(1 − α^(γ+1)) / (1 − α)`` (Leviathan et al. 2023, Equation 1).

    ``E[N] + 1``: the accepted drafts plus the one token the target always adds (the
    replacement at the first rejection, or the bonus token after full acceptance). Limits:
    ``γ+1`` at α = 1, ``1/(1−α)`` as γ → ∞. α = 0.8, γ = 4 gives 3.36.

    Raises:
        TypeError: α not a number or γ not an integer.
        ValueError: α outside [0, 1] or γ < 0.
    """
    a, g = _alpha(alpha), check_int("gamma", gamma, 0)
    if a == 1.0:
        return float(g + 1)
    return (1.0 - a ** (g + 1)) / (1.0 - a)


def speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
    """Expected speed-up over plain decoding: ``E[tokens/round] / (γ·c + v)``.

    Args:
        alpha: acceptance rate α in [0, 1].
        gamma: draft length γ ≥ 0.
        c: draft cost ratio = time of one draft decode step / one target decode step (≥ 0).
        v: verification cost = time of a target forward over γ+1 tokens / one target decode
            step (> 0). ``v = 1`` assumes a bandwidth-bound target (verifying γ+1 tokens costs
            one decode step) and gives Leviathan et al.'s ``(1−α^(γ+1)) / ((1−α)(1+γc))``:
            α = 0.8, γ = 4, c = 0.1 → 2.4×. On a CPU ``v > 1``: measure it
            (:func:`labsupport.bench.speculative.measure_costs`).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: any argument outside its range.
    """
    c = check_real("c", c, 0.0)
    v = check_real("v", v, 0.0, low_open=True)
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + v)


def best_gamma(alpha: float, c: float, gamma_max: int = 16,
               v: float | Sequence[float] | Callable[[int], float] | None = None) -> tuple[int, float]:
    """The draft length γ in ``1..gamma_max`` with the largest :func:`speedup`, and that speed-up.

    ``v`` is the verification cost: ``None`` (= 1, free verification), one number for every γ,
    a sequence indexed by γ (``v[γ]``, so ``v[0]`` is unused) or a function ``γ → v(γ)``.
    α = 0.8, c = 0.1 → γ = 6 (2.47×); α = 0.8, c = 0.05 → γ = 8 (≈ 3.1×).

    Raises:
        TypeError / ValueError: bad α, c or ``gamma_max < 1``.
    """
    check_int("gamma_max", gamma_max, 1)

    def v_of(g: int) -> float:
        if v is None:
            return 1.0
        if callable(v):
            return float(v(g))
        if isinstance(v, (int, float)):
            return float(v)
        return float(v[g])

    scores = [(speedup(alpha, g, c, v_of(g)), g) for g in range(1, gamma_max + 1)]
    s, g = max(scores, key=lambda t: (t[0], -t[1]))
    return g, s


def independent_tokens_estimate(alpha: float, k: int) -> float:
    """A formula that circulates for the speed-up: ``1 / (1 − α + α/(k+1))`` — Amdahl's-law shape.

    It treats each token as independently "sped up k+1 times" with probability α. Real rounds
    stop at the first rejection, so the accepted run is geometric and the expected tokens per
    target forward is :func:`expected_tokens_per_round`. For α = 0.7, k = 5 this formula gives
    2.40, the derived one 2.94 — and a Monte Carlo of the rounds (:func:`simulate_rounds`)
    agrees with the derived one. The two meet only at α = 0, α = 1 and k = 0.

    Raises:
        TypeError: α not a number or k not an integer.
        ValueError: α outside [0, 1] or k < 0.
    """
    a, g = _alpha(alpha), check_int("k", k, 0)
    return 1.0 / (1.0 - a + a / (g + 1))


def simulate_rounds(alpha: float, gamma: int, n_rounds: int, rng: np.random.Generator) -> np.ndarray:
    """Monte Carlo of speculative rounds with i.i.d. acceptance α.

    Args:
        rng: a seeded ``numpy.random.Generator``.

    Returns:
        ``(n_rounds, gamma)`` bool array of *raw* acceptance flags (one coin per draft
        position). Only the prefix up to the first ``False`` counts: see
        :func:`~labsupport.speculative.rejection.accepted_prefix_length`; tokens emitted per
        round = accepted prefix + 1.

    Raises:
        TypeError / ValueError: bad α, ``gamma < 1`` or ``n_rounds < 1`` (naming the parameter).
    """
    a, g = _alpha(alpha), check_int("gamma", gamma, 1)
    n = check_int("n_rounds", n_rounds, 1)
    return rng.random((n, g)) < a
