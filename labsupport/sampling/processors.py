"""The logits processors: each takes logits ``(batch, vocab)`` (a 1-D ``(vocab,)`` tensor is a
batch of one) and returns float32 logits of the same shape in which removed candidates are
``-inf``. Working in float32 means fp16/bf16 logits divided by a tiny temperature cannot
overflow to ``inf``. Logits holding NaN or ``+inf``, or a row whose candidates are all ``-inf``,
have no distribution to sample from: every function raises ``ValueError`` for them.

Sources: repetition penalty (Keskar et al., 2019, CTRL); frequency / presence penalties (the
OpenAI API, as vLLM implements them); temperature softmax (Ackley et al., 1985; Hinton et al.,
2015); top-k (Fan et al., 2018); top-p / nucleus (Holtzman et al., 2019); min-p (Nguyen et al., 2024).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..validation import check_int, check_positive, check_real

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


def _is_row(ids) -> bool:
    """A list / tuple / 1-D+ array of ids (as opposed to a single id)."""
    return isinstance(ids, (list, tuple)) or getattr(ids, "ndim", 0) >= 1


def _rows_of_ids(prev_ids, batch: int, name: str = "prev_ids") -> list[list[int]]:
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
        raise ValueError(f"{name} must have one row per logits row ({batch}), got {len(rows)}")
    return rows




# ----------------------------------------------------------------------------- penalties

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
    check_positive("repetition_penalty", penalty)
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


def apply_frequency_presence_penalty(logits: torch.Tensor, output_ids: torch.Tensor | Sequence,
                                     frequency_penalty: float, presence_penalty: float) -> torch.Tensor:
    """OpenAI / vLLM penalties over the *generated* tokens only (not the prompt):

        z_i ← z_i − frequency_penalty · count_i − presence_penalty · [count_i > 0]

    where ``count_i`` is how often token i was generated so far. Positive values discourage
    repetition (frequency grows with every repeat, presence is paid once); negative values
    encourage it. ``-inf`` stays ``-inf``.

    Args:
        logits: ``(batch, vocab)`` or ``(vocab,)``.
        output_ids: generated ids of each row (a list of lists, or one flat list for one row).
        frequency_penalty, presence_penalty: in [-2, 2] (vLLM's range); 0 disables.

    Raises:
        TypeError / ValueError: a penalty outside [-2, 2], an id outside the vocabulary.
    """
    f = check_real("frequency_penalty", frequency_penalty, -2, 2)
    p = check_real("presence_penalty", presence_penalty, -2, 2)
    z = _as_2d(logits).clone()
    if f == 0.0 and p == 0.0:
        return _restore(z, logits)
    vocab = z.shape[1]
    for b, ids in enumerate(_rows_of_ids(output_ids, z.shape[0], name="output_ids")):
        if len(ids) == 0:
            continue
        idx = torch.as_tensor(ids, dtype=torch.long, device=z.device)
        if idx.min() < 0 or idx.max() >= vocab:
            raise ValueError(f"output_ids must be token ids in [0, {vocab}), got {idx.min().item()}..{idx.max().item()}")
        counts = torch.bincount(idx, minlength=vocab).to(z.dtype)
        z[b] = z[b] - f * counts - p * (counts > 0).to(z.dtype)
    return _restore(z, logits)


def mask_end_ids(logits: torch.Tensor, end_ids: Sequence[int], rows: Sequence[bool]) -> torch.Tensor:
    """``min_tokens``: set the end-of-sequence / stop ids to ``-inf`` in the rows marked True
    (those that have fewer than ``min_tokens`` new tokens), so they cannot end yet.

    Raises:
        ValueError: a row mask of the wrong length, or an id outside the vocabulary.
    """
    z = _as_2d(logits).clone()
    rows = list(rows)
    if len(rows) != z.shape[0]:
        raise ValueError(f"rows must have one flag per logits row ({z.shape[0]}), got {len(rows)}")
    ids = sorted({int(i) for i in end_ids})
    if not ids or not any(rows):
        return _restore(z, logits)
    if ids[0] < 0 or ids[-1] >= z.shape[1]:
        raise ValueError(f"end_ids must be token ids in [0, {z.shape[1]}), got {ids}")
    z[torch.tensor(rows, device=z.device).nonzero().flatten()[:, None], torch.tensor(ids, device=z.device)] = NEG_INF
    return _restore(z, logits)


# ----------------------------------------------------------------------------- temperature and filters

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


def _stable_order(z: torch.Tensor) -> torch.Tensor:
    """Indices that sort each row by logit, largest first; equal logits keep id order (lower id first)."""
    return torch.sort(z, dim=-1, descending=True, stable=True).indices


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest logits, set the rest to ``-inf`` (Fan et al., 2018).

    ``top_k = 0`` disables the filter and ``top_k`` larger than the vocabulary keeps
    everything. **Ties**: every candidate whose logit equals the k-th largest is kept too, so
    more than ``top_k`` may survive and the kept set never depends on token ids — the rule of
    Hugging Face's ``TopKLogitsWarper`` and vLLM's sampler (``k = 2`` on
    ``[0.5, 1.5, 1.5, 1.5, 2.5, -1]`` keeps ``{1, 2, 3, 4}``).

    Raises:
        TypeError: ``top_k`` not an integer.
        ValueError: ``top_k`` < 0.
    """
    top_k = check_int("top_k", top_k, 0, hint=" (0 disables it)")
    z = _as_2d(logits)
    if top_k == 0 or top_k >= z.shape[-1]:
        return _restore(z.clone(), logits)
    kth = torch.topk(z, top_k, dim=-1).values[..., -1:]                  # (batch, 1): the k-th largest
    return _restore(z.masked_fill(z < kth, NEG_INF), logits)


TOP_P_TOLERANCE = 1e-6
"""Mass within this of ``top_p`` counts as reaching it: float32 logits of ``log([0.1, 0.85, 0.05])``
give back 0.85 + 0.10 a hair under 0.95, and the set must still stop there."""


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al., 2019): keep the smallest set whose probability ≥ p.

    Candidates are sorted by probability; one is kept when the mass of the candidates
    *before* it is still below ``top_p`` (summed in float64; mass within
    :data:`TOP_P_TOLERANCE` of p counts as reaching p). The most likely token is always kept,
    and ``[0.5, 0.25, 0.125, 0.125]`` keeps ``{0, 1}`` at p = 0.75 but ``{0, 1, 2}`` at 0.76.
    ``top_p = 1`` keeps everything. **Ties**: among equally likely candidates the lower token
    ids come first (a stable sort), so the kept *probabilities* never depend on the ids, the
    vocabulary size or the batch position — the same rule as :func:`top_k_filter`.

    Args:
        logits: ``(batch, vocab)`` or ``(vocab,)``.
        top_p: p in (0, 1]. p = 0 is rejected (use temperature 0 for greedy).

    Raises:
        TypeError: ``top_p`` not a number.
        ValueError: ``top_p`` outside (0, 1].
    """
    top_p = check_real("top_p", top_p, 0, 1, low_open=True, hint=" (use temperature=0 for greedy)")
    z = _as_2d(logits)
    if top_p >= 1.0:
        return _restore(z.clone(), logits)
    order = _stable_order(z)
    wide = torch.float32 if z.device.type == "mps" else torch.float64      # MPS has no float64
    probs = torch.softmax(z.gather(-1, order).to(wide), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= top_p - TOP_P_TOLERANCE
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
