"""Verification by rejection sampling: exact speculative sampling as pure tensor functions.

Leviathan et al. 2023 (Section 2.3, proof in Appendix A.1) and Chen et al. 2023 (Algorithm 2): accept a
drafted token ``x`` with probability ``min(1, p(x)/q(x))``; at the first rejection sample
from ``normalise(max(0, p − q))``; after γ acceptances sample a bonus token from the last row
``p``. Each token is then emitted with probability ``min(p, q) + max(0, p − q) = p``: the
output is distributed exactly as target sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..sampling import SamplingParams, probs_from_logits, sample_from
from ..validation import check_type


def accepted_prefix_length(flags: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    """How many draft tokens are accepted: the run of ``True`` before the first ``False``.

    ``flags (..., γ)`` bool → ``(...)`` int: ``[T,F,T] → 1``, ``[T,T,T] → 3``,
    ``[F,T,T] → 0``; tokens emitted = this + 1 (the replacement or the bonus token).
    """
    if isinstance(flags, np.ndarray):
        return np.cumprod(flags.astype(np.int64), axis=-1).sum(axis=-1)
    return flags.long().cumprod(dim=-1).sum(dim=-1)


def acceptance_probability(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``min(1, p(x)/q(x))`` for the drafted tokens ``x``.

    Args:
        p, q: ``(..., V)`` target and draft probabilities (after the same sampling processors).
        tokens: ``(...)`` long, the drafted ids.

    Returns:
        ``(...)`` float. A token the draft could not have drawn (``q(x) = 0``) gets 1 if the
        target allows it, else 0 — never NaN.
    """
    idx = tokens.long().unsqueeze(-1)
    p_x = p.gather(-1, idx).squeeze(-1)
    q_x = q.gather(-1, idx).squeeze(-1)
    ratio = (p_x / q_x.clamp_min(torch.finfo(q.dtype).tiny)).clamp(max=1.0)
    return torch.where(q_x > 0, ratio, (p_x > 0).to(p.dtype))


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``normalise(max(0, p − q))``: where to sample from after a rejection
    (Leviathan et al. 2023, Algorithm 1).

    ``p, q (..., V)`` → ``(..., V)``, rows summing to 1. Where ``p ≤ q`` everywhere (``p = q``;
    a rejection then has probability 0 and can only come from rounding) the row is ``p``.
    p = [0.6, 0.3, 0.1], q = [0.2, 0.5, 0.3] → [1, 0, 0].
    """
    r = (p - q).clamp_min(0.0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 1e-12, r / mass.clamp_min(1e-30), p)


@dataclass
class VerifyResult:
    """Outcome of :func:`verify` for a batch of B rounds.

    Attributes:
        num_accepted: ``(B,)`` accepted draft tokens n (the prefix before the first rejection).
        next_token: ``(B,)`` the target's token after them: a sample of the residual at
            position n when n < γ, else the bonus token from ``p_γ``.
        accepted: ``(B, γ)`` raw coin flags (positions after the first rejection are ignored).
        accept_prob: ``(B, γ)`` ``min(1, p/q)`` of each drafted token.
    """

    num_accepted: torch.Tensor
    next_token: torch.Tensor
    accepted: torch.Tensor
    accept_prob: torch.Tensor

    def tokens(self, draft_tokens: torch.Tensor, b: int = 0) -> list[int]:
        """Tokens emitted by round ``b``: ``draft[:n] + [next_token]``."""
        n = int(self.num_accepted[b])
        return [int(t) for t in draft_tokens[b, :n]] + [int(self.next_token[b])]


def verify(p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor,
           generator: torch.Generator | None = None, num_draft: torch.Tensor | None = None) -> VerifyResult:
    """Exact speculative sampling (rejection sampling) for a batch of rounds.

    Args:
        p: ``(B, γ+1, V)`` target probabilities: row i is the distribution of the token after
            ``d_1..d_i`` (row γ is for the bonus token).
        q: ``(B, γ, V)`` the draft probabilities the tokens were drawn from (one-hot for a
            deterministic proposer such as n-gram lookup).
        draft_tokens: ``(B, γ)`` long.
        generator: for the acceptance coins and the replacement draws.
        num_draft: ``(B,)`` optional real draft length per row (``≤ γ``); positions beyond it
            are padding: never accepted, and the token there is sampled from ``p`` itself.

    Returns:
        :class:`VerifyResult`. Emitted tokens per row: ``draft[:n] + [next_token]``.

    Raises:
        ValueError: shapes that do not fit together.
    """
    if p.dim() != 3 or q.dim() != 3 or draft_tokens.dim() != 2:
        raise ValueError(f"p, q, draft_tokens must be (B, γ+1, V), (B, γ, V), (B, γ); got "
                         f"{tuple(p.shape)}, {tuple(q.shape)}, {tuple(draft_tokens.shape)}")
    B, g1, V = p.shape
    g = g1 - 1
    if q.shape != (B, g, V) or draft_tokens.shape != (B, g):
        raise ValueError(f"q must be {(B, g, V)} and draft_tokens {(B, g)} for p {tuple(p.shape)}, "
                         f"got {tuple(q.shape)} and {tuple(draft_tokens.shape)}")
    if draft_tokens.dtype.is_floating_point or draft_tokens.dtype == torch.bool:
        raise TypeError(f"draft_tokens must be an integer tensor, got {draft_tokens.dtype}")
    if draft_tokens.numel() and (int(draft_tokens.min()) < 0 or int(draft_tokens.max()) >= V):
        raise ValueError(f"draft_tokens must be token ids in [0, {V}) (the vocabulary of p), got ids "
                         f"{int(draft_tokens.min())}..{int(draft_tokens.max())}")
    accept_prob = acceptance_probability(p[:, :g], q, draft_tokens)                  # (B, γ)
    u = torch.rand((B, g), generator=generator, device=p.device)
    accepted = u < accept_prob
    dist = torch.cat([residual_distribution(p[:, :g], q), p[:, g:]], dim=1)          # (B, γ+1, V)
    if num_draft is not None:
        real = torch.arange(g, device=p.device).unsqueeze(0) < num_draft.to(p.device).unsqueeze(1)
        accepted = accepted & real
        pad = torch.cat([~real, torch.zeros((B, 1), dtype=torch.bool, device=p.device)], dim=1)
        dist = torch.where(pad.unsqueeze(-1), p, dist)
    n = accepted_prefix_length(accepted)                                              # (B,)
    next_token = sample_from(dist[torch.arange(B, device=p.device), n], generator)
    return VerifyResult(num_accepted=n, next_token=next_token, accepted=accepted, accept_prob=accept_prob)


def verify_logits(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_tokens: torch.Tensor,
                  params: SamplingParams, generator: torch.Generator | None = None) -> VerifyResult:
    """:func:`verify` from raw logits: the **same** sampling processors turn both into p and q.

    Args:
        target_logits: ``(B, γ+1, V)``; draft_logits: ``(B, γ, V)``; draft_tokens ``(B, γ)``.
        params: temperature / top-k / top-p / min-p applied identically to both sides
            (applying the temperature to one side only breaks exactness — tested).

    Repetition penalty needs each row's history; the generation loop passes ``prev_ids``
    through :func:`labsupport.sampling.probs_from_logits` itself.

    Raises:
        TypeError: logits not tensors.
        ValueError: shapes that do not fit together (e.g. two vocabularies), as :func:`verify`.
    """
    check_type("target_logits", target_logits, torch.Tensor)
    check_type("draft_logits", draft_logits, torch.Tensor)
    if target_logits.dim() != 3 or draft_logits.dim() != 3:
        raise ValueError(f"target_logits and draft_logits must be (B, γ+1, V) and (B, γ, V), got "
                         f"{tuple(target_logits.shape)} and {tuple(draft_logits.shape)}")
    B, g1, V = target_logits.shape
    if tuple(draft_logits.shape) != (B, g1 - 1, V):
        raise ValueError(f"draft_logits must be {(B, g1 - 1, V)} for target_logits {tuple(target_logits.shape)} "
                         f"(same batch and vocabulary, one row fewer), got {tuple(draft_logits.shape)}")
    p = probs_from_logits(target_logits.reshape(-1, V), params).reshape(B, g1, V)
    q = probs_from_logits(draft_logits.reshape(-1, V), params).reshape(B, g1 - 1, V)
    return verify(p, q, draft_tokens, generator)
