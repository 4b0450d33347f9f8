"""Speculative decoding: a cheap proposer drafts γ tokens, the target verifies them in one forward.

Sources: Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative
Decoding" (ICML 2023); Chen et al., "Accelerating LLM Decoding with Speculative Sampling"
(2023); seed ``000_…`` 5.3.9–5.3.13 (proof and speed-up derivation), seed ``001_…``
(theory vs Monte Carlo), seeds ``002_…`` / ``004_…`` (practice and variants).

One *round* (names as in the seeds and vLLM):

1. the proposer drafts ``γ`` tokens ``d_1..d_γ`` (draft model: sampled from its ``q``;
   n-gram prompt lookup: copied from earlier text, ``q`` one-hot);
2. the target runs **one** forward over ``[last, d_1..d_γ]`` and gives ``γ+1`` rows ``p``;
3. :func:`verify`: accept ``d_i`` with probability ``min(1, p(d_i)/q(d_i))``, left to right,
   up to the first rejection; at a rejection sample from ``normalise(max(0, p − q))``; when all
   ``γ`` are accepted sample one **bonus token** from the last row ``p_γ``;
4. roll back the KV of rejected tokens in both models (``DynamicCache.crop(-k)``).

The emitted tokens are distributed exactly as target sampling (the seed's proof: each token
is emitted with ``min(p, q) + max(0, p − q) = p``). Greedy is the special case where ``p`` and
``q`` are one-hot: a draft token is accepted iff it is the target's arg-max.

This module holds: the theory formulas, the verification as pure tensor functions, the two
proposers, the generation loop over Hugging Face models with KV rollback, statistics, cost
measurement, and an exact two-token check of the output distribution.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .generation import _check_length, _prompt_ids, _stop_hit
from .models import LoadedModel, model_forward
from .sampling import GREEDY, SamplingParams, apply_repetition_penalty, probs_from_logits

# ============================================================================ theory


def _check_alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    return float(alpha)


def _check_gamma(gamma: int, low: int = 0) -> int:
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or gamma < low:
        raise ValueError(f"gamma must be an integer >= {low}, got {gamma!r}")
    return int(gamma)


def expected_accepted(alpha: float, gamma: int) -> float:
    """E[N], accepted draft tokens per round: ``Σ_{j=1..γ} α^j = α(1−α^γ)/(1−α)`` (seed 000 §5.3.11).

    Assumes every draft token is accepted independently with probability α.

    Raises:
        ValueError: α outside [0, 1] or γ not an integer ≥ 0.
    """
    a, g = _check_alpha(alpha), _check_gamma(gamma)
    return float(sum(a ** j for j in range(1, g + 1)))


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """Tokens emitted per target forward: ``(1 − α^(γ+1)) / (1 − α)`` (seed 000 §5.3.11, seed 001).

    ``E[N] + 1``: the accepted drafts plus the one token the target always adds (the
    replacement at the first rejection, or the bonus token after full acceptance). Limits:
    ``γ+1`` at α = 1, ``1/(1−α)`` as γ → ∞. α = 0.8, γ = 4 gives 3.36.

    Raises:
        ValueError: α outside [0, 1] or γ not an integer ≥ 0.
    """
    a, g = _check_alpha(alpha), _check_gamma(gamma)
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
            step (> 0). ``v = 1`` is the seeds' assumption (bandwidth-bound, verification is
            free) and gives seed 000's ``(1−α^(γ+1)) / ((1−α)(1+γc))``: α = 0.8, γ = 4,
            c = 0.1 → 2.4×. On a CPU ``v > 1`` (``../shared/notes/tiny-model-training.md``).

    Raises:
        ValueError: any argument outside its range.
    """
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0:
        raise ValueError(f"c must be a finite number >= 0, got {c!r}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"v must be a finite number > 0, got {v!r}")
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + v)


def best_gamma(alpha: float, c: float, gamma_max: int = 16,
               v: float | Sequence[float] | Callable[[int], float] | None = None) -> tuple[int, float]:
    """The draft length γ in ``1..gamma_max`` with the largest :func:`speedup`, and that speed-up.

    ``v`` is the verification cost: ``None`` (= 1, the seeds), one number for every γ, a
    sequence indexed by γ (``v[γ]``, so ``v[0]`` is unused) or a function ``γ → v(γ)``.
    Seed 000: α = 0.8, c = 0.1 → γ = 6 (2.47×); seed 001: α = 0.8, c = 0.05 → γ = 8 (≈ 3.1×).

    Raises:
        ValueError: bad α, c or ``gamma_max < 1``.
    """
    _check_gamma(gamma_max, 1)

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


def amdahl_speedup(alpha: float, k: int) -> float:
    """Seed 004's formula ``1 / (1 − α + α/(k+1))`` — an Amdahl's-law shape, *not* the derived one.

    It treats each token as independently "sped up k+1 times" with probability α. Real rounds
    stop at the first rejection, so the accepted run is geometric and the expected tokens
    per target forward is :func:`expected_tokens_per_round`. For α = 0.7, k = 5 this formula
    gives 2.40 (the seed prints "≈ 2.3"), the derived one 2.94 — and a Monte Carlo of the
    rounds (:func:`simulate_rounds`) agrees with the derived one. The two meet only at α = 0,
    α = 1 and k = 0.

    Raises:
        ValueError: α outside [0, 1] or k not an integer ≥ 0.
    """
    a, g = _check_alpha(alpha), _check_gamma(k)
    return 1.0 / (1.0 - a + a / (g + 1))


def simulate_rounds(alpha: float, gamma: int, n_rounds: int, rng: np.random.Generator) -> np.ndarray:
    """Monte Carlo of speculative rounds with i.i.d. acceptance α (seed 001's simulator).

    Args:
        rng: a seeded ``numpy.random.Generator``.

    Returns:
        ``(n_rounds, gamma)`` bool array of *raw* acceptance flags (one coin per draft
        position). Only the prefix up to the first ``False`` counts: see
        :func:`accepted_prefix_length`; tokens emitted per round = accepted prefix + 1.

    Raises:
        ValueError: bad α, γ < 1 or ``n_rounds < 1``.
    """
    a, g = _check_alpha(alpha), _check_gamma(gamma, 1)
    _check_gamma(n_rounds, 1)
    return rng.random((int(n_rounds), g)) < a


# ============================================================================ verification


def accepted_prefix_length(flags: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    """How many draft tokens are accepted: the run of ``True`` before the first ``False``.

    ``flags (..., γ)`` bool → ``(...)`` int. Case C20: ``[T,F,T] → 1``, ``[T,T,T] → 3``,
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
    """``normalise(max(0, p − q))``: where to sample from after a rejection (seed 000 §5.3.10).

    ``p, q (..., V)`` → ``(..., V)``, rows summing to 1. Where ``p ≤ q`` everywhere (``p = q``;
    a rejection then has probability 0 and can only come from rounding) the row is ``p``.
    Case C18: p = [0.6, 0.3, 0.1], q = [0.2, 0.5, 0.3] → [1, 0, 0].
    """
    r = (p - q).clamp_min(0.0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 1e-12, r / mass.clamp_min(1e-30), p)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of ``probs (..., V)`` → ``(...)`` long, by inverse CDF with one uniform
    per row: the first id whose cumulative weight exceeds ``u · Σ`` (zero-weight ids are never
    picked; like ``torch.multinomial`` it tolerates rows that do not sum to 1, and it is ~10×
    faster on many short rows)."""
    cdf = probs.reshape(-1, probs.shape[-1]).float().cumsum(dim=-1)
    u = torch.rand((cdf.shape[0], 1), generator=generator, device=cdf.device) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[-1] - 1)
    return idx.reshape(probs.shape[:-1])


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
    """
    B, g1, V = target_logits.shape
    p = probs_from_logits(target_logits.reshape(-1, V), params).reshape(B, g1, V)
    q = probs_from_logits(draft_logits.reshape(-1, V), params).reshape(B, g1 - 1, V)
    return verify(p, q, draft_tokens, generator)


# ============================================================================ proposers


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise unless draft and target share one tokenizer and vocabulary.

    Speculative verification compares ``p(x)`` and ``q(x)`` for the same id ``x``: the ids
    must mean the same strings and the logits must have the same width.

    Raises:
        ValueError: different logits width, token→id maps, or end-of-sequence id.
    """
    vt, vd = int(target.model.config.vocab_size), int(draft.model.config.vocab_size)
    if vt != vd:
        raise ValueError(f"draft and target must share a vocabulary: target vocab_size {vt}, draft {vd}")
    mt, md = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if mt != md:
        diff = sorted(set(mt.items()) ^ set(md.items()))[:3]
        raise ValueError(f"draft and target must share a tokenizer: token→id maps differ "
                         f"({len(mt)} vs {len(md)} entries, e.g. {diff})")
    if target.eos_token_id != draft.eos_token_id:
        raise ValueError(f"draft and target must share the end-of-sequence id: "
                         f"{target.eos_token_id} vs {draft.eos_token_id}")


class _CachedLM:
    """A model with a KV cache and the ids it holds; syncs to a new sequence by cropping."""

    def __init__(self, lm: LoadedModel):
        self.lm = lm
        self.cache = None
        self.cached: list[int] = []

    def reset(self) -> None:
        self.cache, self.cached = None, []

    def sync(self, seq: Sequence[int]) -> None:
        """Keep the KV of the longest common prefix of the cached ids and ``seq`` (minus its last
        token, which must be fed again to get logits); drop the rest (``crop(-k)``)."""
        keep = 0
        limit = min(len(self.cached), len(seq) - 1)
        while keep < limit and self.cached[keep] == seq[keep]:
            keep += 1
        drop = len(self.cached) - keep
        if drop > 0:
            self.cache.crop(-drop)
            del self.cached[keep:]

    def forward(self, new_ids: Sequence[int]) -> torch.Tensor:
        """Feed ``new_ids`` after the cached ones; returns logits ``(len(new_ids), V)`` float32."""
        inp = torch.tensor([list(new_ids)], device=self.lm.device)
        logits, self.cache = model_forward(self.lm.model, inp, self.cache)
        self.cached.extend(int(t) for t in new_ids)
        return logits[0].float()


@dataclass
class Proposal:
    """Draft tokens and the distributions they came from: ``tokens`` (k ≤ γ), ``q (k, V)`` or
    ``None`` for a deterministic proposer (``q`` is then one-hot)."""

    tokens: list[int]
    q: torch.Tensor | None = None


class DraftModelProposer:
    """A small draft model with its own KV cache (the independent-draft variant).

    Args:
        draft: the draft model (e.g. ``load_model("tiny-gpt2-draft")``).
        target: the target it drafts for; checked at setup with :func:`check_same_vocabulary`.

    Raises:
        ValueError: draft and target do not share a tokenizer and vocabulary.
    """

    name = "draft model"

    def __init__(self, draft: LoadedModel, target: LoadedModel | None = None):
        if target is not None:
            check_same_vocabulary(target, draft)
        self.kv = _CachedLM(draft)
        self.forwards = 0
        self.seconds = 0.0

    def start(self, prompt_ids: Sequence[int]) -> None:
        """Reset and prefill the prompt (all but its last token)."""
        self.kv.reset()
        self.forwards, self.seconds = 0, 0.0
        if len(prompt_ids) > 1:
            self.kv.forward(prompt_ids[:-1])

    @torch.no_grad()
    def propose(self, seq: Sequence[int], gamma: int, params: SamplingParams,
                generator: torch.Generator | None = None) -> Proposal:
        """Draft ``gamma`` tokens after ``seq``: γ draft forwards (the first feeds whatever the
        cache lacks, usually one token), each token sampled from ``q`` = the processed draft
        distribution (the arg-max when greedy)."""
        start = time.perf_counter()
        self.kv.sync(seq)
        logits = self.kv.forward(seq[len(self.kv.cached):])[-1]
        tokens: list[int] = []
        rows = []
        for i in range(gamma):
            if params.greedy:                               # q is one-hot at the arg-max: no need to build it
                z = logits if params.repetition_penalty == 1.0 else apply_repetition_penalty(
                    logits, list(seq) + tokens, params.repetition_penalty)
                tok = int(z.argmax())
            else:
                q = probs_from_logits(logits.unsqueeze(0), params, [list(seq) + tokens])[0]
                tok = int(sample_from(q, generator))
                rows.append(q)
            tokens.append(tok)
            if i < gamma - 1:
                logits = self.kv.forward([tok])[-1]
        self.forwards += gamma
        self.seconds += time.perf_counter() - start
        return Proposal(tokens, torch.stack(rows) if rows else None)


class NgramProposer:
    """Prompt lookup (n-gram drafting): copy what followed the latest earlier occurrence of the
    longest matching suffix n-gram in prompt + output (seed 002; HF ``prompt_lookup_num_tokens``).

    Args:
        max_ngram: longest suffix tried (≥ 1); shorter ones down to ``min_ngram`` are tried next.
        min_ngram: shortest suffix accepted as a match (≥ 1).

    Raises:
        ValueError: bad n-gram sizes.
    """

    name = "n-gram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        _check_gamma(min_ngram, 1)
        if isinstance(max_ngram, bool) or not isinstance(max_ngram, int) or max_ngram < min_ngram:
            raise ValueError(f"max_ngram must be an integer >= min_ngram ({min_ngram}), got {max_ngram!r}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.forwards = 0
        self.seconds = 0.0

    def start(self, prompt_ids: Sequence[int]) -> None:
        self.forwards, self.seconds = 0, 0.0

    def propose(self, seq: Sequence[int], gamma: int, params: SamplingParams | None = None,
                generator: torch.Generator | None = None) -> Proposal:
        """Up to ``gamma`` tokens (possibly none when no n-gram matches)."""
        start = time.perf_counter()
        tokens = lookup_ngram(seq, gamma, self.max_ngram, self.min_ngram)
        self.seconds += time.perf_counter() - start
        return Proposal(tokens, None)


def lookup_ngram(seq: Sequence[int], gamma: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """The continuation (≤ γ tokens) after an earlier match of the longest suffix n-gram.

    The latest match with a full γ-token continuation wins, else the match with the longest
    one (a match near the end has only a few tokens after it).
    ``lookup_ngram([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]``. Returns ``[]`` when nothing matches.
    """
    seq = list(seq)
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        suffix, best = seq[-n:], []
        for j in range(len(seq) - n - 1, -1, -1):            # latest occurrence first, not the suffix
            if seq[j:j + n] == suffix and len(seq[j + n:j + n + gamma]) > len(best):
                best = seq[j + n:j + n + gamma]
                if len(best) == gamma:                       # a full-length continuation: take it
                    break
        if best:
            return best
    return []


# ============================================================================ the loop


@dataclass
class RoundRecord:
    """One draft-verify round.

    Attributes:
        position: sequence length when the round started.
        draft_tokens: the proposal (k ≤ γ tokens).
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

    ``reached[i]``: rounds in which draft position i was verified (all earlier ones accepted);
    ``accepted[i]``: those in which it was accepted. Times in seconds.
    """

    gamma: int
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

    @classmethod
    def from_rounds(cls, rounds: Sequence[RoundRecord], gamma: int) -> SpecStats:
        s = cls(gamma=gamma, reached=[0] * gamma, accepted=[0] * gamma)
        for r in rounds:
            s.add(r)
        return s

    def add(self, r: RoundRecord) -> None:
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
        """Mean ``Σ min(p, q)`` over verified positions: the expected α (Leviathan et al. §3.1)."""
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


@dataclass
class SpeculativeResult:
    """What :func:`speculative_generate` produced (fields as in ``GenerationResult``)."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    rounds: list[RoundRecord]
    stats: SpecStats
    seconds: float


def verify_round(logits: torch.Tensor, prop: Proposal, seq: Sequence[int], params: SamplingParams,
                 generator: torch.Generator | None = None) -> RoundRecord:
    """Verify one sequence's proposal from the target's logits over ``[last, d_1..d_k]``.

    Args:
        logits: ``(k+1, V)`` target logits; row i predicts the token after ``d_1..d_i``.
        prop: the :class:`Proposal` (``q`` None = deterministic, one-hot).
        seq: the committed sequence before the round (prompt + output), for the processors.
        params: sampling settings, applied identically to p and q (history per row for the
            repetition penalty).

    Returns:
        A :class:`RoundRecord` (``emitted`` still empty: :func:`emit_block` fills it).
    """
    k = len(prop.tokens)
    history = [list(seq) + prop.tokens[:i] for i in range(k + 1)] if params.repetition_penalty != 1.0 else None
    top = logits.argmax(dim=-1).tolist()                                             # (k+1,)
    if params.greedy:               # p and q one-hot: accept while draft == target arg-max, no randomness
        best = top if history is None else apply_repetition_penalty(
            logits, history, params.repetition_penalty).argmax(dim=-1).tolist()
        hit = [float(prop.tokens[i] == best[i]) for i in range(k)]       # = min(1, p/q) = Σ min(p, q)
        n = hit.index(0.0) if 0.0 in hit else k
        return RoundRecord(position=len(seq), draft_tokens=list(prop.tokens), num_accepted=n, next_token=best[n],
                           bonus=(k > 0 and n == k), emitted=[], accept_prob=hit, overlap=hit, target_argmax=top)
    p = probs_from_logits(logits, params, history)                                   # (k+1, V)
    if prop.q is not None:
        q = prop.q.to(p)
    else:
        q = torch.nn.functional.one_hot(torch.tensor(prop.tokens, dtype=torch.long, device=p.device),
                                        p.shape[-1]).to(p)
    q = q.reshape(k, p.shape[-1])
    drafts = torch.tensor([prop.tokens], dtype=torch.long, device=p.device).reshape(1, k)
    res = verify(p.unsqueeze(0), q.unsqueeze(0), drafts, generator)
    n = int(res.num_accepted[0])
    return RoundRecord(position=len(seq), draft_tokens=list(prop.tokens), num_accepted=n,
                       next_token=int(res.next_token[0]), bonus=(k > 0 and n == k), emitted=[],
                       accept_prob=res.accept_prob[0].tolist(), overlap=torch.minimum(p[:k], q).sum(-1).tolist(),
                       target_argmax=top)


def emit_block(rec: RoundRecord, seq: list[int], new: list[int], *, eos: int | None, stop: Sequence[str],
               max_new: int, decode: Callable[[Sequence[int]], str]) -> str | None:
    """Append the round's tokens (accepted drafts, then the target's token) one by one, applying
    the stopping rules after each: EOS, a stop string in the new text, ``max_new`` tokens.

    Tokens after the stopping point are discarded. Fills ``rec.emitted``; appends to ``seq``
    and ``new`` in place.

    Returns:
        ``"stop"``, ``"length"``, or None to go on.
    """
    for tok in rec.draft_tokens[:rec.num_accepted] + [rec.next_token]:
        seq.append(tok)
        new.append(tok)
        rec.emitted.append(tok)
        if eos is not None and tok == eos:
            return "stop"
        if stop and _stop_hit(decode(new), stop) is not None:
            return "stop"
        if len(new) >= max_new:
            return "length"
    return None


@torch.no_grad()
def speculative_generate(target: LoadedModel, proposer, prompt: str | Sequence[int],
                         params: SamplingParams = GREEDY, *, gamma: int = 4,
                         max_new_tokens: int | None = None,
                         generator: torch.Generator | None = None) -> SpeculativeResult:
    """Generate with speculative decoding: draft γ, verify in one target forward, roll back.

    The target's KV cache holds every committed token but the last; each round feeds
    ``[last, d_1..d_k]`` (k+1 tokens), verifies with :func:`verify`, appends the accepted
    prefix and the target's token one by one under the stopping rules (EOS, stop strings,
    ``max_new_tokens`` — anything after them in the block is discarded), then crops the KV of
    rejected tokens from both caches (``DynamicCache.crop(-k)``).

    Args:
        target: the target model.
        proposer: :class:`DraftModelProposer` or :class:`NgramProposer` (anything with
            ``start(prompt_ids)``, ``propose(seq, γ, params, generator) -> Proposal``,
            ``forwards``, ``seconds``).
        prompt: text or token ids.
        params: sampling settings, applied identically to target and draft; greedy →
            output token-identical to greedy target decoding.
        gamma: draft length γ ≥ 1 (shortened near ``max_new_tokens``: a round never drafts
            more than it could emit).
        max_new_tokens: default ``params.max_tokens``.
        generator: for drafting and verification (default: seeded from ``params.seed``).

    Returns:
        :class:`SpeculativeResult` with per-round records and :class:`SpecStats`.

    Raises:
        ValueError: empty prompt, bad γ, or a length beyond the model's position limit.
    """
    gamma = _check_gamma(gamma, 1)
    ids = _prompt_ids(target, prompt)
    max_new = params.max_tokens if max_new_tokens is None else max_new_tokens
    _check_length(target, len(ids), max_new)
    if generator is None and params.seed is not None:
        generator = torch.Generator(device=target.device).manual_seed(params.seed)
    eos = None if params.ignore_eos else target.eos_token_id
    t0 = time.perf_counter()
    tgt = _CachedLM(target)
    if len(ids) > 1:
        tgt.forward(ids[:-1])                                   # prefill
    proposer.start(ids)
    stats = SpecStats(gamma=gamma, reached=[0] * gamma, accepted=[0] * gamma)
    stats.prefill_seconds = time.perf_counter() - t0
    seq, new, rounds = list(ids), [], []
    finish = None
    while finish is None:
        g = min(gamma, max_new - len(new) - 1)                  # never draft more than can be emitted
        prop = proposer.propose(seq, g, params, generator) if g > 0 else Proposal([])
        t1 = time.perf_counter()
        tgt.sync(seq)
        logits = tgt.forward(seq[len(tgt.cached):] + prop.tokens)[-(len(prop.tokens) + 1):]   # (k+1, V)
        rec = verify_round(logits, prop, seq, params, generator)
        stats.target_seconds += time.perf_counter() - t1
        stats.target_forwards += 1
        finish = emit_block(rec, seq, new, eos=eos, stop=params.stop, max_new=max_new, decode=target.decode)
        rounds.append(rec)
        stats.add(rec)
    stats.draft_forwards, stats.draft_seconds = proposer.forwards, proposer.seconds
    out_ids = new[:-1] if finish == "stop" and eos is not None and new and new[-1] == eos else new
    text = target.decode(out_ids)
    cut = _stop_hit(text, params.stop) if params.stop else None
    return SpeculativeResult(prompt_ids=ids, token_ids=new, text=text[:cut] if cut is not None else text,
                             finish_reason=finish, rounds=rounds, stats=stats,
                             seconds=time.perf_counter() - t0)


# ============================================================================ measured costs


@dataclass
class CostModel:
    """Measured step costs (seconds, fastest of the repeats) and the ratios the speed-up formula needs.

    ``c = t_draft / t_target``; ``v[γ]`` = time of a target forward over γ+1 new tokens / t_target.
    """

    t_target: float
    t_draft: float
    v: dict[int, float]

    @property
    def c(self) -> float:
        return self.t_draft / self.t_target

    def predicted_speedup(self, tokens_per_round: float, gamma: int, c: float | None = None) -> float:
        """``E[tokens per round] / (γ·c + v(γ))`` (c defaults to the measured draft ratio)."""
        return tokens_per_round / (gamma * (self.c if c is None else c) + self.v[gamma])


@torch.no_grad()
def measure_costs(target: LoadedModel, draft: LoadedModel | None, context: Sequence[int],
                  gammas: Sequence[int] = range(1, 9), repeats: int = 20) -> CostModel:
    """Time one decode step of target and draft, and target forwards over γ+1 tokens.

    Each repeat times every measurement once, in turn (target 1 token, draft 1 token, target
    γ+1 tokens for each γ), after ``context`` is in the KV cache; the fastest time of each
    counts (other processes only ever add time) and interleaving keeps the ratios fair when
    the machine's load changes.

    Args:
        context: token ids already in the KV cache when timing (e.g. a prompt).
        gammas: draft lengths whose verification cost ``v(γ)`` is measured.
        repeats: timed rounds (two untimed warm-up rounds come first); wall-clock, so use one
            torch thread.

    Returns:
        :class:`CostModel` (``t_draft = 0`` when ``draft`` is None, e.g. for n-gram lookup).
    """
    _check_gamma(repeats, 1)
    models = {"target": _CachedLM(target)}
    if draft is not None:
        models["draft"] = _CachedLM(draft)
    for kv in models.values():
        kv.forward(context)
    jobs = [("target", 1)] + ([("draft", 1)] if draft is not None else []) + [("target", int(g) + 1) for g in gammas]
    best = {job: float("inf") for job in jobs}
    for r in range(repeats + 2):
        for name, n in jobs:
            kv = models[name]
            new = list(context[-n:]) if len(context) >= n else [0] * n
            t = time.perf_counter()
            kv.forward(new)
            if r >= 2:
                best[(name, n)] = min(best[(name, n)], time.perf_counter() - t)
            kv.cache.crop(-n)
            del kv.cached[-n:]
    t_target = best[("target", 1)]
    return CostModel(t_target=t_target, t_draft=best.get(("draft", 1), 0.0),
                     v={int(g): best[("target", int(g) + 1)] / t_target for g in gammas})


@dataclass
class SweepRow:
    """One γ of :func:`speedup_sweep` (times in seconds, ratios unitless)."""

    gamma: int
    alpha: float                   # measured acceptance rate
    by_position: list[float]       # acceptance per draft position
    tokens_per_round: float        # measured tokens per target forward
    theory: float                  # (1−α^(k+1))/(1−α) at the measured α, averaged over draft lengths k
    mean_draft: float              # k̄, mean draft length actually proposed
    c: float                       # draft cost per drafted token / one target decode step
    v: float                       # verification cost v(round(k̄))
    predicted: float               # tokens_per_round / (k̄·c + v)
    seed_formula: float            # tokens_per_round / (k̄·c + 1): the seeds' free verification
    measured: float                # wall-clock speed-up: plain seconds / speculative seconds
    plain_seconds: float
    spec_seconds: float


def speedup_sweep(target: LoadedModel, make_proposer: Callable[[], object], prompt: str | Sequence[int],
                  params: SamplingParams, gammas: Sequence[int], max_new_tokens: int, costs: CostModel,
                  repeats: int = 3) -> list[SweepRow]:
    """Measure speculative decoding against plain decoding for several γ, next to the predictions.

    Plain decoding is :func:`labsupport.generation.generate` (no per-step records) with the
    same ``params``. For every γ the plain and the speculative run alternate ``repeats`` times
    and the fastest of each counts, so a change in the machine's load hits both sides. For a
    draft *model* c is the measured ``costs.c``; for a proposer without a model (n-gram) it is
    the proposer's own measured time per drafted token over a target decode step.

    Args:
        make_proposer: returns a fresh proposer (e.g. ``lambda: DraftModelProposer(draft, target)``).
        params: sampling settings; use ``ignore_eos=True`` so both runs emit ``max_new_tokens``.
        costs: from :func:`measure_costs` on the same machine (its ``v`` must cover the γs).

    Returns:
        One :class:`SweepRow` per γ.
    """
    from .generation import generate

    _check_gamma(repeats, 1)
    ids = _prompt_ids(target, prompt)
    rows = []
    for g in gammas:
        prop = make_proposer()
        plain_s = spec_s = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            generate(target, ids, params, max_new_tokens=max_new_tokens, record=False)
            t1 = time.perf_counter()
            res = speculative_generate(target, prop, ids, params, gamma=int(g), max_new_tokens=max_new_tokens)
            t2 = time.perf_counter()
            plain_s, spec_s = min(plain_s, t1 - t0), min(spec_s, t2 - t1)
        st = res.stats
        k_mean = st.mean_draft_length
        if isinstance(prop, DraftModelProposer):
            c = costs.c
        else:
            c = st.draft_seconds / max(st.proposed, 1) / costs.t_target
        v = costs.v.get(max(1, round(k_mean)), costs.v[max(costs.v)])
        rows.append(SweepRow(gamma=int(g), alpha=st.alpha, by_position=st.acceptance_by_position,
                             tokens_per_round=st.tokens_per_round, theory=st.theory_tokens_per_round,
                             mean_draft=k_mean, c=c, v=v, predicted=st.tokens_per_round / (k_mean * c + v),
                             seed_formula=st.tokens_per_round / (k_mean * c + 1.0), measured=plain_s / spec_s,
                             plain_seconds=plain_s, spec_seconds=spec_s))
    return rows


# ============================================================================ exactness check


@dataclass
class TwoTokenTree:
    """Target and draft logits at a prefix and at prefix + every token that can come first,
    restricted to ``vocab`` (every token any of those distributions can emit).

    ``t0, d0``: ``(V',)``; ``t1, d1``: ``(V', V')`` — row a is after prefix + ``vocab[a]``
    (rows of tokens that cannot come first are zeros and never used).
    """

    vocab: list[int]
    t0: torch.Tensor
    d0: torch.Tensor
    t1: torch.Tensor
    d1: torch.Tensor

    def exact_joint(self, params: SamplingParams) -> torch.Tensor:
        """``P(x1, x2) = p(x1) · p(x2 | x1)`` of target sampling, ``(V', V')``."""
        p0 = probs_from_logits(self.t0.unsqueeze(0), params)[0]
        p1 = probs_from_logits(self.t1, params)
        return p0.unsqueeze(1) * p1


@torch.no_grad()
def two_token_tree(target: LoadedModel, draft: LoadedModel, prefix: Sequence[int],
                   params: SamplingParams, max_support: int = 64) -> TwoTokenTree:
    """Build a :class:`TwoTokenTree` with one batched forward per model.

    Exact because the processors only ever keep a token's relative weight among kept tokens:
    restricting the logits to a set that contains every kept token changes nothing.

    Raises:
        ValueError: more than ``max_support`` possible first tokens (use ``top_k``), or greedy.
    """
    if params.greedy:
        raise ValueError("params must sample (temperature > 0) for a distribution check, got greedy")
    if params.repetition_penalty != 1.0 or (params.top_p < 1.0 and params.top_k == 0):
        raise ValueError("params for the two-token check may use temperature, top_k, min_p and top_p "
                         f"only together with top_k (restriction must be exact), got {params}")
    check_same_vocabulary(target, draft)
    prefix = [int(t) for t in prefix]
    last = {}
    for lm, key in ((target, "t"), (draft, "d")):
        last[key] = model_forward(lm.model, torch.tensor([prefix], device=lm.device), use_cache=False)[0][0, -1].float()
    first = sorted(set(torch.nonzero(probs_from_logits(last["t"], params) > 0).flatten().tolist())
                   | set(torch.nonzero(probs_from_logits(last["d"], params) > 0).flatten().tolist()))
    if len(first) > max_support:
        raise ValueError(f"first-token support must have <= {max_support} tokens for enumeration, got "
                         f"{len(first)}: set top_k (e.g. 8)")
    batch = torch.tensor([prefix + [a] for a in first])
    nxt = {}
    for lm, key in ((target, "t"), (draft, "d")):
        nxt[key] = model_forward(lm.model, batch.to(lm.device), use_cache=False)[0][:, -1].float()
    support = set(first)
    for key in ("t", "d"):
        support |= set(torch.nonzero((probs_from_logits(nxt[key], params) > 0).any(0)).flatten().tolist())
    vocab = sorted(support)
    cols = torch.tensor(vocab)
    row_of = {a: vocab.index(a) for a in first}
    t1 = torch.zeros((len(vocab), len(vocab)))
    d1 = torch.zeros((len(vocab), len(vocab)))
    for i, a in enumerate(first):
        t1[row_of[a]] = nxt["t"][i, cols].cpu()
        d1[row_of[a]] = nxt["d"][i, cols].cpu()
    return TwoTokenTree(vocab=vocab, t0=last["t"][cols].cpu(), d0=last["d"][cols].cpu(), t1=t1, d1=d1)


VerifyLogitsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, SamplingParams, torch.Generator | None],
                          VerifyResult]


def simulate_two_tokens(tree: TwoTokenTree, params: SamplingParams, n_trials: int, generator: torch.Generator,
                        verify_fn: VerifyLogitsFn = verify_logits) -> torch.Tensor:
    """Empirical joint of the first two emitted tokens of speculative sampling with γ = 1.

    Each trial: draft ``d ~ q(·|prefix)``; verify against ``[p(·|prefix), p(·|prefix, d)]``;
    if accepted the tokens are ``d`` and the bonus; if rejected the first is the replacement
    ``x1`` and a second round from prefix + x1 gives the second. ``verify_fn`` is the function
    under test (:func:`verify_logits`, or a deliberately broken copy in the tests).

    Returns:
        ``(V', V')`` frequencies (sum 1), comparable with :meth:`TwoTokenTree.exact_joint`.
    """
    _check_gamma(n_trials, 1)
    V = len(tree.vocab)
    B = int(n_trials)
    pad = torch.zeros(B, 1, V)                                  # a row that is never used for 2 tokens
    d1 = sample_from(probs_from_logits(tree.d0.unsqueeze(0), params).expand(B, V), generator)
    r1 = verify_fn(torch.stack([tree.t0.expand(B, V), tree.t1[d1]], dim=1), tree.d0.expand(B, 1, V),
                   d1.unsqueeze(1), params, generator)
    acc = r1.num_accepted > 0
    x1 = torch.where(acc, d1, r1.next_token)
    d2 = sample_from(probs_from_logits(tree.d1[x1], params), generator)
    r2 = verify_fn(torch.cat([tree.t1[x1].unsqueeze(1), pad], dim=1), tree.d1[x1].unsqueeze(1),
                   d2.unsqueeze(1), params, generator)
    x2 = torch.where(acc, r1.next_token, torch.where(r2.num_accepted > 0, d2, r2.next_token))
    counts = torch.bincount(x1 * V + x2, minlength=V * V).float()
    return (counts / B).reshape(V, V)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    """``½ Σ |p − q|`` over all entries."""
    return 0.5 * float((p - q).abs().sum())


def sampling_noise_floor(probs: torch.Tensor, n_trials: int, generator: torch.Generator, repeats: int = 20) -> float:
    """Mean total variation between ``probs`` and the frequencies of ``n_trials`` direct draws
    from it (``repeats`` times): what an exact sampler scores on average."""
    flat = probs.flatten().double()
    tvs = []
    for _ in range(repeats):
        draws = torch.multinomial(flat, n_trials, replacement=True, generator=generator)
        freq = torch.bincount(draws, minlength=flat.numel()).double() / n_trials
        tvs.append(total_variation(freq, flat))
    return float(np.mean(tvs))
