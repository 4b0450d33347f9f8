"""How spread out a distribution is: entropy, perplexity, the mass of the top candidates, and
the probability ratio a temperature gives (Shannon, 1948; Jelinek et al., 1977)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..validation import check_real, check_type


def entropy_bits(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy ``H(p) = -Σ p_i log2 p_i`` in bits, over the last dimension (Shannon, 1948).

    Zero-probability entries contribute 0 (no NaN). Input ``(..., vocab)``; output ``(...)``.

    Raises:
        TypeError: ``probs`` not a tensor.
        ValueError: ``probs`` contains NaN, a negative entry, or a row that does not sum to 1
            (within 1e-3).
    """
    check_type("probs", probs, torch.Tensor)
    p = probs.float()
    if torch.isnan(p).any():
        raise ValueError("probs must not contain NaN")
    if (p < 0).any():
        raise ValueError(f"probs must be a distribution (entries >= 0), got a minimum of {float(p.min()):.4g}")
    sums = p.sum(dim=-1)
    if p.numel() and ((sums - 1).abs() > 1e-3).any():
        worst = float(sums[(sums - 1).abs().argmax()]) if sums.dim() else float(sums)
        raise ValueError(f"probs must be a distribution (each row sums to 1), got a row summing to {worst:.4g}")
    terms = torch.where(p > 0, p * torch.log2(p.clamp_min(torch.finfo(torch.float32).tiny)), torch.zeros_like(p))
    return 0.0 - terms.sum(dim=-1)        # not -sum: a one-hot p would give -0.0 ("−0.00 bits")


def perplexity(probs: torch.Tensor) -> torch.Tensor:
    """``PPL = 2^H(p)``: the effective number of candidates (k for a uniform k-way choice)."""
    return torch.exp2(entropy_bits(probs))


def sequence_perplexity(token_logprobs: Sequence[float]) -> float:
    """Perplexity of a text from its per-token natural-log probabilities: ``exp(-mean log p)``.

    A perplexity beyond the float range (mean log p below about -709) is ``inf``.

    Raises:
        TypeError: not a sequence of numbers.
        ValueError: empty input, or a value that is not a finite log-probability (<= 0).
    """
    if isinstance(token_logprobs, (str, bytes)) or not hasattr(token_logprobs, "__iter__"):
        raise TypeError(f"token_logprobs must be a sequence of numbers, got {type(token_logprobs).__name__}")
    lp = [check_real(f"token_logprobs[{i}]", v, high=0.0) for i, v in enumerate(token_logprobs)]
    if not lp:
        raise ValueError("token_logprobs must hold at least one value, got 0")
    try:
        return math.exp(-sum(lp) / len(lp))
    except OverflowError:
        return math.inf


def candidates_for_mass(probs: torch.Tensor, mass: float = 0.9) -> int:
    """How many of the most likely candidates are needed to reach ``mass`` (e.g. 90 %).

    Raises:
        TypeError: ``mass`` not a number.
        ValueError: ``mass`` outside (0, 1].
    """
    check_real("mass", mass, 0, 1, low_open=True)
    check_type("probs", probs, torch.Tensor)
    p = torch.sort(probs.float().flatten(), descending=True).values
    csum = torch.cumsum(p, dim=0)
    return int(min(len(p), int((csum < mass - 1e-9).sum()) + 1))


def probability_ratio(logit_gap: float, temperature: float) -> float:
    """``p_i / p_j = exp((z_i - z_j) / T)`` for a logit gap at temperature T.

    Gap 2 gives ≈ 7.4 at T = 1, ≈ 55 at T = 0.5 and ≈ 2.7 at T = 2. A ratio beyond the
    float range (e.g. gap 100 at T = 0.01) is ``inf``.

    Raises:
        TypeError: an argument not a number.
        ValueError: ``logit_gap`` not finite, or temperature not > 0.
    """
    check_real("logit_gap", logit_gap)
    check_real("temperature", temperature, 0, low_open=True)
    try:
        return math.exp(logit_gap / temperature)
    except OverflowError:
        return math.inf
