"""Turning logits into a next token: the logits processors, ``SamplingParams`` and ``sample``.

Every processor takes logits of shape ``(batch, vocab)`` (a 1-D ``(vocab,)`` tensor is
accepted and treated as a batch of one) and returns float32 logits of the same shape in
which removed candidates are ``-inf``. Working in float32 means fp16/bf16 logits divided by
a tiny temperature cannot overflow to ``inf``.

The pipeline order is the one of Hugging Face ``generate`` (and of vLLM's sampler)::

    repetition penalty → temperature → top-k → top-p → min-p → renormalise → sample

so top-p and min-p see the *temperature-scaled* distribution. Temperature 0 means
greedy: the arg-max of the penalised logits, with no division at all.

``-inf`` is a removed candidate. Logits holding NaN or ``+inf``, or a row whose candidates are
all ``-inf``, have no distribution to sample from: every function here raises ``ValueError``
for them rather than returning NaN probabilities or a silent arg-max of garbage.

Sources: temperature softmax (Hinton et al., 2015; Ackley et al., 1985); entropy and
perplexity (Shannon, 1948; Jelinek et al., 1977); top-k (Fan et al., 2018);
top-p / nucleus (Holtzman et al., 2019); min-p (Nguyen et al., 2024); repetition penalty
(Keskar et al., 2019, CTRL).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from .validation import check_bool, check_int, check_real

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------- helpers

def _as_2d(logits: torch.Tensor) -> torch.Tensor:
    """float32 view of ``logits`` as ``(batch, vocab)``.

    ``-inf`` marks a removed candidate; NaN, ``+inf`` and a row with no finite logit are
    rejected (they would turn every probability into NaN).
    """
    if not isinstance(logits, torch.Tensor):
        logits = torch.as_tensor(logits, dtype=torch.float32)
    if logits.dim() == 1:
        logits = logits.unsqueeze(0)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (vocab,) or (batch, vocab), got {tuple(logits.shape)}")
    if logits.shape[-1] == 0:
        raise ValueError("logits must have at least one candidate (vocab >= 1), got vocab 0")
    z = logits.float()
    for bad, name in ((torch.isnan(z), "NaN"), (z == math.inf, "+inf")):
        if bad.any():
            row, col = torch.nonzero(bad)[0].tolist()
            raise ValueError(f"logits must be finite or -inf (a removed candidate), got {name} at row {row}, id {col}")
    empty = ~torch.isfinite(z).any(dim=-1)
    if empty.any():
        raise ValueError(f"logits must keep at least one finite candidate per row, "
                         f"got row {int(torch.nonzero(empty)[0])} all -inf")
    return z


def _restore(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return out.squeeze(0) if isinstance(like, torch.Tensor) and like.dim() == 1 else out


# ----------------------------------------------------------------------------- processors

def apply_repetition_penalty(logits: torch.Tensor, prev_ids: torch.Tensor | Sequence,
                             penalty: float) -> torch.Tensor:
    """CTRL repetition penalty (Keskar et al., 2019): make every already-seen token less likely.

    A seen token's logit is divided by ``penalty`` when positive and multiplied by it when
    negative, so both move down (``[-2, 1, 0.5]`` with tokens 0, 1 seen and 2.0
    gives ``[-4, 0.5, 0.5]``). A token counts once however often it was seen.

    Args:
        logits: ``(batch, vocab)`` or ``(vocab,)``.
        prev_ids: token ids already in each sequence: ``(batch, seq)`` tensor, or a list of
            id lists (one per row), or one flat list for a single row.
        penalty: θ ≥ 1 penalises, 1 disables; values in (0, 1) *reward* repeats. A result
            beyond float32's range saturates at ±3.4e38 (it never becomes ±inf).

    Raises:
        TypeError: ``penalty`` not a number.
        ValueError: ``penalty`` is not > 0, or an id is outside the vocabulary.
    """
    _check_positive("repetition_penalty", penalty)
    z = _as_2d(logits).clone()
    if penalty == 1.0:
        return _restore(z, logits)
    rows = _rows_of_ids(prev_ids, z.shape[0])
    vocab = z.shape[1]
    for b, ids in enumerate(rows):
        if len(ids) == 0:
            continue
        idx = torch.unique(torch.as_tensor(ids, dtype=torch.long, device=z.device))
        if idx.min() < 0 or idx.max() >= vocab:
            raise ValueError(f"prev_ids must be token ids in [0, {vocab}), got {idx.min().item()}..{idx.max().item()}")
        seen = z[b, idx]
        moved = torch.where(seen > 0, seen / penalty, seen * penalty)
        big = torch.finfo(torch.float32).max                      # a huge θ must not make ±inf
        z[b, idx] = torch.where(torch.isfinite(seen), moved.clamp(-big, big), seen)
    return _restore(z, logits)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Scale logits by 1/T (``p_i = exp(z_i/T) / Σ exp(z_j/T)``).

    The row maximum is subtracted *before* dividing, which leaves the softmax unchanged
    (shift invariance) and keeps tiny temperatures finite: the winner stays at 0, the others
    go towards ``-inf`` (even when T underflows float32, e.g. 1e-320).

    Args:
        logits: ``(batch, vocab)`` or ``(vocab,)``.
        temperature: T > 0. (T = 0 is greedy; :func:`sample` handles it without dividing.)

    Raises:
        TypeError: T is not a number.
        ValueError: T is not a finite number > 0.
    """
    check_real("temperature", temperature, 0, low_open=True, hint=" here (0 means greedy in sample())")
    z = _as_2d(logits)
    top = z.max(dim=-1, keepdim=True).values                       # finite: _as_2d checked
    scaled = torch.where(z == top, 0.0, (z - top) / float(temperature))   # 0 / (T → 0 in fp32) is not NaN
    return _restore(scaled, logits)


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest logits, set the rest to ``-inf`` (Fan et al., 2018).

    ``top_k = 0`` disables the filter and ``top_k`` larger than the vocabulary keeps
    everything. Ties at the k-th value are all kept.

    Raises:
        TypeError: ``top_k`` is not an integer.
        ValueError: ``top_k`` < 0.
    """
    top_k = check_int("top_k", top_k, 0, hint=" (0 disables it)")
    z = _as_2d(logits)
    if top_k == 0 or top_k >= z.shape[-1]:
        return _restore(z.clone(), logits)
    kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
    return _restore(z.masked_fill(z < kth, NEG_INF), logits)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al., 2019): keep the smallest set whose probability ≥ p.

    Candidates are sorted by probability; one is kept when the mass of the candidates
    *before* it is still below ``top_p``. The most likely token is therefore always kept, and
    ``[0.5, 0.25, 0.125, 0.125]`` keeps ``{0, 1}`` at p = 0.75 but ``{0, 1, 2}`` at 0.76. ``top_p = 1`` keeps everything.

    Args:
        logits: ``(batch, vocab)`` or ``(vocab,)``; computed in float32.
        top_p: p in (0, 1]. p = 0 is rejected (use temperature 0 for greedy).

    Raises:
        TypeError: ``top_p`` not a number.
        ValueError: ``top_p`` outside (0, 1].
    """
    check_real("top_p", top_p, 0, 1, low_open=True, hint=" (use temperature=0 for greedy)")
    z = _as_2d(logits)
    if top_p >= 1.0:
        return _restore(z.clone(), logits)
    sorted_z, order = torch.sort(z, dim=-1, descending=True)
    probs = torch.softmax(sorted_z, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False                      # the arg-max always survives
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return _restore(z.masked_fill(drop, NEG_INF), logits)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Min-p filter (Nguyen et al., 2024): drop candidates with ``p_i < min_p · max_j p_j``.

    The threshold scales with the model's confidence. The arg-max always passes, so the kept
    set is never empty: ``[0.1, 0.2, 0.3, 0.4]`` keeps all / ``{1,2,3}`` / ``{3}`` /
    ``{3}`` at min-p 0 / 0.26 / 0.76 / 1.0.

    Raises:
        TypeError: ``min_p`` not a number.
        ValueError: ``min_p`` outside [0, 1].
    """
    check_real("min_p", min_p, 0, 1)
    z = _as_2d(logits)
    if min_p == 0.0:
        return _restore(z.clone(), logits)
    logp = torch.log_softmax(z, dim=-1)
    # p_i >= min_p * p_max  ⇔  log p_i >= log min_p + log p_max  (stable in log space)
    threshold = logp.max(dim=-1, keepdim=True).values + math.log(min_p)
    return _restore(z.masked_fill(logp < threshold, NEG_INF), logits)


# ----------------------------------------------------------------------------- parameters

def _check_positive(name: str, value: float) -> float:
    return check_real(name, value, 0, low_open=True)


def _is_row(ids) -> bool:
    """A list / tuple / 1-D+ array of ids (as opposed to a single id)."""
    return isinstance(ids, (list, tuple)) or getattr(ids, "ndim", 0) >= 1


def _rows_of_ids(prev_ids, batch: int) -> list[list[int]]:
    if isinstance(prev_ids, torch.Tensor):
        if prev_ids.dim() == 1:
            prev_ids = prev_ids.unsqueeze(0)
        rows = [r.tolist() for r in prev_ids]
    else:
        prev_ids = list(prev_ids)
        if not prev_ids:                                    # empty history: nothing seen yet
            rows = [[]]
        elif not _is_row(prev_ids[0]):
            rows = [list(prev_ids)]
        else:
            rows = [list(r.tolist() if hasattr(r, "tolist") else r) for r in prev_ids]
    if len(rows) == 1 and batch > 1:
        rows = rows * batch
    if len(rows) != batch:
        raise ValueError(f"prev_ids must have one row per logits row ({batch}), got {len(rows)}")
    return rows


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token (names follow vLLM's ``SamplingParams``).

    Attributes:
        temperature: T ≥ 0; 0 is greedy (arg-max), 1 the model's own distribution.
        top_k: keep the k most likely tokens; 0 disables (default).
        top_p: nucleus mass in (0, 1]; 1 disables (default).
        min_p: relative threshold in [0, 1]; 0 disables (default).
        repetition_penalty: θ > 0; 1 disables (default), 1.1–1.3 is typical.
        max_tokens: most new tokens to generate (≥ 1).
        stop: strings that end generation when they appear in the new text (not included).
        ignore_eos: keep going after the end-of-sequence token.
        n: number of samples per prompt (parallel sampling; the engine shares their prompt blocks).
        seed: seed of this request's own ``torch.Generator`` in [0, 2**63) (``None`` = caller's
            generator); the engine seeds sample k of ``n`` with ``seed + k``.

    Numbers may be Python or numpy scalars (stored as ``int`` / ``float``); ``stop`` may be one
    string, a list of strings or ``None``.

    Raises:
        TypeError: a field of the wrong type (``top_k=2.0``, ``temperature="0.5"``, ``ignore_eos=1``).
        ValueError: any field outside its range, naming the field, the value and the range.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        check_real("temperature", self.temperature, 0, hint=" (0 = greedy)")
        check_int("top_k", self.top_k, 0, hint=" (0 disables it)")
        check_real("top_p", self.top_p, 0, 1, low_open=True, hint=" (use temperature=0 for greedy)")
        check_real("min_p", self.min_p, 0, 1)
        _check_positive("repetition_penalty", self.repetition_penalty)
        check_int("max_tokens", self.max_tokens, 1)
        check_int("n", self.n, 1)
        raw_stop = () if self.stop is None else self.stop
        stop = (raw_stop,) if isinstance(raw_stop, str) else raw_stop
        if not isinstance(stop, (list, tuple)) or any(not isinstance(s, str) for s in stop):
            raise TypeError(f"stop must be non-empty strings (one, a list of them, or None), got {self.stop!r}")
        if any(s == "" for s in stop):
            raise ValueError(f"stop must be non-empty strings (one, a list of them, or None), got {self.stop!r}")
        check_bool("ignore_eos", self.ignore_eos)
        if self.seed is not None:
            check_int("seed", self.seed, 0, 2 ** 63 - 1, hint=" or None")
        for name, kind in (("temperature", float), ("top_k", int), ("top_p", float), ("min_p", float),
                           ("repetition_penalty", float), ("max_tokens", int), ("n", int)):
            object.__setattr__(self, name, kind(getattr(self, name)))   # numpy scalars → int / float
        object.__setattr__(self, "stop", tuple(stop))
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))

    @property
    def greedy(self) -> bool:
        """True when decoding is the arg-max (temperature 0)."""
        return self.temperature == 0

    @property
    def is_plain_greedy(self) -> bool:
        """True when the next token is the arg-max of the raw logits: greedy with no penalty."""
        return self.greedy and self.repetition_penalty == 1.0

    def replace(self, **changes) -> SamplingParams:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


GREEDY = SamplingParams(temperature=0.0)


# ----------------------------------------------------------------------------- pipeline

def process_logits(logits: torch.Tensor, params: SamplingParams,
                   prev_ids: torch.Tensor | Sequence | None = None) -> torch.Tensor:
    """Apply the whole pipeline: penalty → temperature → top-k → top-p → min-p.

    Args:
        logits: ``(batch, vocab)`` or ``(vocab,)``.
        params: the :class:`SamplingParams`.
        prev_ids: ids already in each sequence (prompt + output), for the repetition penalty.

    Returns:
        float32 logits of the same shape; removed candidates are ``-inf``. With
        temperature 0 everything but the arg-max is removed (greedy).
    """
    z = _as_2d(logits)
    if params.repetition_penalty != 1.0 and prev_ids is not None:
        z = apply_repetition_penalty(z, prev_ids, params.repetition_penalty)
    if params.greedy:
        best = z.argmax(dim=-1, keepdim=True)
        out = torch.full_like(z, NEG_INF).scatter(-1, best, 0.0)
        return _restore(out, logits)
    z = apply_temperature(z, params.temperature)
    z = top_k_filter(z, params.top_k)
    z = top_p_filter(z, params.top_p)
    z = min_p_filter(z, params.min_p)
    return _restore(z, logits)


def probs_from_logits(logits: torch.Tensor, params: SamplingParams,
                      prev_ids: torch.Tensor | Sequence | None = None) -> torch.Tensor:
    """The distribution ``sample`` draws from: softmax of :func:`process_logits` (rows sum to 1)."""
    return torch.softmax(process_logits(logits, params, prev_ids), dim=-1)


def sample(logits: torch.Tensor, params: SamplingParams = GREEDY,
           generator: torch.Generator | None = None,
           prev_ids: torch.Tensor | Sequence | None = None) -> torch.Tensor:
    """Pick one token per row.

    Args:
        logits: ``(batch, vocab)`` or ``(vocab,)``.
        params: sampling settings; temperature 0 returns the arg-max without any randomness.
        generator: the ``torch.Generator`` to draw from (on the logits' device); ``None``
            uses one seeded with ``params.seed`` if set, else torch's global generator.
        prev_ids: ids already in each sequence (for the repetition penalty).

    Returns:
        ``(batch,)`` long tensor of token ids (a 0-d tensor for 1-D logits).
    """
    z = _as_2d(logits)
    if params.greedy:
        if params.repetition_penalty != 1.0 and prev_ids is not None:
            z = apply_repetition_penalty(z, prev_ids, params.repetition_penalty)
        ids = z.argmax(dim=-1)
    else:
        probs = probs_from_logits(z, params, prev_ids)
        if generator is None and params.seed is not None:
            generator = torch.Generator(device=probs.device).manual_seed(params.seed)
        ids = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return ids.squeeze(0) if isinstance(logits, torch.Tensor) and logits.dim() == 1 else ids


# ----------------------------------------------------------------------------- explaining a step

@dataclass
class FilterTrace:
    """What each processor did to one row of logits (for the sampling lab).

    All tensors are ``(vocab,)``. ``reason[i]`` is ``""`` for a kept candidate, else the first
    filter that removed it: ``"top-k"``, ``"top-p"``, ``"min-p"`` (or ``"greedy"``).
    """

    base_probs: torch.Tensor      # softmax(penalised logits / T): before any cut
    final_probs: torch.Tensor     # renormalised over the kept set: what is sampled from
    kept: torch.Tensor            # bool
    reason: list[str]

    @property
    def num_kept(self) -> int:
        return int(self.kept.sum())


def trace_filters(logits: torch.Tensor, params: SamplingParams,
                  prev_ids: Sequence[int] | None = None) -> FilterTrace:
    """Run the pipeline on one row of logits ``(vocab,)`` and record why each candidate was cut."""
    z = _as_2d(logits)
    if z.shape[0] != 1:
        raise ValueError(f"logits must be one row (vocab,), got batch {z.shape[0]}")
    if params.repetition_penalty != 1.0 and prev_ids is not None:
        z = apply_repetition_penalty(z, prev_ids, params.repetition_penalty)
    vocab = z.shape[-1]
    reason = [""] * vocab
    if params.greedy:
        base = torch.softmax(z, dim=-1)[0]
        final = torch.softmax(process_logits(z, params), dim=-1)[0]
        kept = final > 0
        for i in torch.nonzero(~kept).flatten().tolist():
            reason[i] = "greedy"
        return FilterTrace(base, final, kept, reason)
    z = apply_temperature(z, params.temperature)
    base = torch.softmax(z, dim=-1)[0]
    for name, fn, arg in (("top-k", top_k_filter, params.top_k), ("top-p", top_p_filter, params.top_p),
                          ("min-p", min_p_filter, params.min_p)):
        before = torch.isfinite(z[0])
        z = fn(z, arg)
        for i in torch.nonzero(before & ~torch.isfinite(z[0])).flatten().tolist():
            reason[i] = name
    final = torch.softmax(z, dim=-1)[0]
    return FilterTrace(base, final, torch.isfinite(z[0]), reason)


# ----------------------------------------------------------------------------- measures

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
    _check_positive("temperature", temperature)
    try:
        return math.exp(logit_gap / temperature)
    except OverflowError:
        return math.inf
