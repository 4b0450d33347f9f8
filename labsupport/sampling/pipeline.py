"""The sampling pipeline: logits → processed logits → probabilities → one token per row.

The order is Hugging Face ``generate``'s::

    penalties (repetition, frequency, presence) → min_tokens mask → grammar mask
    → temperature → top-k → top-p → min-p → renormalise → sample

so top-p and min-p see the *temperature-scaled* distribution. vLLM v1's sampler applies min-p
before top-k / top-p; with both min-p and top-p set the two orders can keep different tokens
(probabilities 0.5 / 0.3 / 0.2, min-p 0.5, top-p 0.6: this order keeps the first two, vLLM's the first). Temperature 0 means greedy:
the arg-max of the penalised, masked logits, with no division at all.

Rows carry their history for the penalties: ``prev_ids`` is each row's prompt + output so far
and ``prompt_lens`` says where its output starts (frequency / presence penalties and
``min_tokens`` look at the output only, the repetition penalty at both). ``end_ids`` are the
ids ``min_tokens`` holds back: the model's EOS ids and the request's ``stop_token_ids``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from ..validation import check_type
from .params import GREEDY, SamplingParams
from .processors import (
    NEG_INF,
    _as_2d,
    _restore,
    _rows_of_ids,
    apply_frequency_presence_penalty,
    apply_repetition_penalty,
    apply_temperature,
    mask_end_ids,
    min_p_filter,
    top_k_filter,
    top_p_filter,
)

History = torch.Tensor | Sequence | None


def _output_rows(prev_ids: History, prompt_lens: int | Sequence[int] | None, batch: int,
                 params: SamplingParams) -> list[list[int]]:
    if prev_ids is None or prompt_lens is None:
        raise ValueError("frequency_penalty, presence_penalty and min_tokens need each row's history: "
                         "pass prev_ids (prompt + output) and prompt_lens (where the output starts)")
    rows = _rows_of_ids(prev_ids, batch)
    lens = [int(prompt_lens)] * batch if isinstance(prompt_lens, int) else [int(n) for n in prompt_lens]
    if len(lens) != batch or any(not 0 <= n <= len(r) for n, r in zip(lens, rows)):
        raise ValueError(f"prompt_lens must give, for each of the {batch} rows, a length in [0, len(prev_ids row)], "
                         f"got {prompt_lens!r}")
    return [r[n:] for r, n in zip(rows, lens)]


def penalise(logits: torch.Tensor, params: SamplingParams, prev_ids: History = None,
             prompt_lens: int | Sequence[int] | None = None, end_ids: Iterable[int] = (),
             allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The steps before temperature: repetition penalty (prompt + output), frequency and presence
    penalties (output only), the ``min_tokens`` mask on ``end_ids``, and the structured-output
    grammar mask ``allowed`` (bool ``(batch, vocab)`` or ``(vocab,)``: False → ``-inf``).

    Raises:
        ValueError: an output-based setting without ``prompt_lens``.
    """
    check_type("params", params, SamplingParams)
    z = _as_2d(logits)
    if params.repetition_penalty != 1.0 and prev_ids is not None:
        z = apply_repetition_penalty(z, prev_ids, params.repetition_penalty)
    needs_output = params.frequency_penalty != 0.0 or params.presence_penalty != 0.0 or params.min_tokens > 0
    if needs_output:
        outputs = _output_rows(prev_ids, prompt_lens, z.shape[0], params)
        z = apply_frequency_presence_penalty(z, outputs, params.frequency_penalty, params.presence_penalty)
        if params.min_tokens > 0:
            z = mask_end_ids(z, end_ids, [len(o) < params.min_tokens for o in outputs])
    if allowed is not None:
        from ..structured.logits import apply_structured_mask  # lazy: structured builds on sampling
        z = apply_structured_mask(z, allowed)
    return z


def process_logits(logits: torch.Tensor, params: SamplingParams, prev_ids: History = None, *,
                   prompt_lens: int | Sequence[int] | None = None, end_ids: Iterable[int] = (),
                   allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Apply the whole pipeline (module docstring).

    Args:
        logits: ``(batch, vocab)`` or ``(vocab,)``.
        params: the :class:`SamplingParams`.
        prev_ids: ids already in each sequence (prompt + output), for the penalties.
        prompt_lens: where each row's output starts in ``prev_ids`` (one int for all rows).
        end_ids: EOS / stop ids that ``min_tokens`` holds back.
        allowed: optional grammar mask (structured output), applied before temperature.

    Returns:
        float32 logits of the same shape; removed candidates are ``-inf``. With
        temperature 0 everything but the arg-max is removed (greedy).
    """
    z = penalise(logits, params, prev_ids, prompt_lens, end_ids, allowed)
    if params.greedy:
        best = z.argmax(dim=-1, keepdim=True)
        out = torch.full_like(z, NEG_INF).scatter(-1, best, 0.0)
        return _restore(out, logits)
    z = apply_temperature(z, params.temperature)
    z = top_k_filter(z, params.top_k)
    z = top_p_filter(z, params.top_p)
    z = min_p_filter(z, params.min_p)
    return _restore(z, logits)


def probs_from_logits(logits: torch.Tensor, params: SamplingParams, prev_ids: History = None, *,
                      prompt_lens: int | Sequence[int] | None = None, end_ids: Iterable[int] = (),
                      allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The distribution ``sample`` draws from: softmax of :func:`process_logits` (rows sum to 1)."""
    return torch.softmax(process_logits(logits, params, prev_ids, prompt_lens=prompt_lens, end_ids=end_ids,
                                        allowed=allowed), dim=-1)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of ``probs (..., V)`` → ``(...)`` long, by inverse CDF with one uniform
    per row: the first id whose cumulative weight exceeds ``u · Σ`` (zero-weight ids are never
    picked; like ``torch.multinomial`` it tolerates rows that do not sum to 1, and it is ~10×
    faster on many short rows). The one way every path of the package draws a token: :func:`sample`,
    the engine's sampler, rejection sampling and the drafters.

    Raises:
        TypeError: ``probs`` not a tensor.
        ValueError: a row with NaN, a negative weight, or no positive weight (nothing to draw).
    """
    check_type("probs", probs, torch.Tensor)
    rows = probs.reshape(-1, probs.shape[-1]).float()
    if not torch.isfinite(rows).all() or (rows < 0).any():
        raise ValueError("probs must hold finite weights >= 0 (no NaN or inf)")
    if (rows.sum(dim=-1) <= 0).any():
        raise ValueError("probs must have a positive total weight in every row, got an all-zero row")
    cdf = rows.cumsum(dim=-1)
    u = torch.rand((cdf.shape[0], 1), generator=generator, device=cdf.device) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[-1] - 1)
    return idx.reshape(probs.shape[:-1])


def sample(logits: torch.Tensor, params: SamplingParams = GREEDY, generator: torch.Generator | None = None,
           prev_ids: History = None, *, prompt_lens: int | Sequence[int] | None = None,
           end_ids: Iterable[int] = (), allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Pick one token per row.

    Args:
        logits: ``(batch, vocab)`` or ``(vocab,)``.
        params: sampling settings; temperature 0 returns the arg-max without any randomness.
        generator: the ``torch.Generator`` to draw from (on the logits' device); ``None``
            uses one seeded with ``params.seed`` if set, else torch's global generator.
        prev_ids, prompt_lens, end_ids: each row's history, as :func:`process_logits`.
        allowed: optional grammar mask (structured output), as :func:`process_logits`.

    Returns:
        ``(batch,)`` long tensor of token ids (a 0-d tensor for 1-D logits).
    """
    check_type("params", params, SamplingParams)
    if params.greedy:
        ids = greedy_ids(penalise(logits, params, prev_ids, prompt_lens, end_ids, allowed))
    else:
        probs = probs_from_logits(logits, params, prev_ids, prompt_lens=prompt_lens, end_ids=end_ids,
                                  allowed=allowed)
        if generator is None and params.seed is not None:
            generator = torch.Generator(device=probs.device).manual_seed(params.seed)
        ids = sample_from(probs, generator)
    return ids.squeeze(0) if isinstance(logits, torch.Tensor) and logits.dim() == 1 else ids


# ----------------------------------------------------------------------------- explaining a step

def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """Arg-max over the last dimension, the lowest id among ties (as ``argmax``): ``max(dim=-1).indices``,
    which on CPU runs about 3× faster than ``argmax`` on the engine's logits (one thread, 4,096 columns:
    60 µs against 180 µs for 32 rows, 17 against 44 for 8, 4.5 against 6.6 for one row)."""
    return logits.max(dim=-1).indices


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


def trace_filters(logits: torch.Tensor, params: SamplingParams, prev_ids: Sequence[int] | None = None, *,
                  prompt_lens: int | None = None, end_ids: Iterable[int] = ()) -> FilterTrace:
    """Run the pipeline on one row of logits ``(vocab,)`` and record why each candidate was cut."""
    z = _as_2d(logits)
    if z.shape[0] != 1:
        raise ValueError(f"logits must be one row (vocab,), got batch {z.shape[0]}")
    z = penalise(z, params, prev_ids, prompt_lens, end_ids)
    vocab = z.shape[-1]
    reason = [""] * vocab
    if params.greedy:
        base = torch.softmax(z, dim=-1)[0]
        final = torch.softmax(process_logits(z, params.replace(repetition_penalty=1.0, frequency_penalty=0.0,
                                                               presence_penalty=0.0, min_tokens=0)), dim=-1)[0]
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
