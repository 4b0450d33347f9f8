"""How spread out a distribution is: entropy, perplexity, the mass of the top candidates, and
the probability ratio a temperature gives (Shannon, 1948; Jelinek et al., 1977)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..validation import check_real


def entropy_bits(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy ``H(p) = -Σ p_i log2 p_i`` in bits, over the last dimension (Shannon, 1948).

    Zero-probability entries contribute 0 (no NaN). Input ``(..., vocab)``; output ``(...)``.

    Raises:
        ValueError: ``probs`` contains NaN.
    """
    p = probs.float()
    if torch.isnan(p).any():
        raise ValueError("probs must not contain NaN")
    terms = torch.where(p > 0, p * torch.log2(p.clamp_min(torch.finfo(torch.float32).tiny)), torch.zeros_like(p))
    return -terms.sum(dim=-1)


def perplexity(probs: torch.Tensor) -> torch.Tensor:
    """``PPL = 2^H(p)``: the effective number of candidates (k for a uniform k-way choice)."""
    return torch.exp2(entropy_bits(probs))


def sequence_perplexity(token_logprobs: Sequence[float]) -> float:
    """Perplexity of a text from its per-token natural-log probabilities: ``exp(-mean log p)``.

    Raises:
        ValueError: empty input.
    """
    lp = list(token_logprobs)
    if not lp:
        raise ValueError("token_logprobs must hold at least one value, got 0")
    return math.exp(-sum(lp) / len(lp))


def candidates_for_mass(probs: torch.Tensor, mass: float = 0.9) -> int:
    """How many of the most likely candidates are needed to reach ``mass`` (e.g. 90 %).

    Raises:
        TypeError: ``mass`` not a number.
        ValueError: ``mass`` outside (0, 1].
    """
    check_real("mass", mass, 0, 1, low_open=True)
    p = torch.sort(probs.float().flatten(), descending=True).values
    csum = torch.cumsum(p, dim=0)
    return int(min(len(p), int((csum < mass - 1e-9).sum()) + 1))


def probability_ratio(logit_gap: float, temperature: float) -> float:
    """``p_i / p_j = exp((z_i - z_j) / T)`` for a logit gap at temperature T.

    Gap 2 gives ≈ 7.4 at T = 1, ≈ 55 at T = 0.5 and ≈ 2.7 at T = 2. A ratio beyond the
    float range (e.g. gap 100 at T = 0.01) is ``inf``.

    Raises:
        ValueError: temperature not > 0.
    """
    check_real("temperature", temperature, 0, low_open=True)
    try:
        return math.exp(logit_gap / temperature)
    except OverflowError:
        return math.inf
