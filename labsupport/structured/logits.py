"""The masking step of the logits pipeline: disallowed tokens get ``-inf``.

    repetition penalty → **grammar mask** → temperature → top-k → top-p → min-p → sample

Masking before temperature and the truncation filters means top-k / top-p choose among
*valid* tokens only, and every masked token has probability exactly 0 after the softmax
(``exp(-inf) = 0``) — it can never be sampled, at any temperature.
"""

from __future__ import annotations

import torch


def apply_structured_mask(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Set ``logits`` to ``-inf`` wherever ``mask`` is False (returns a new float32 tensor).

    Args:
        logits: ``(vocab,)`` or ``(batch, vocab)``.
        mask: bool of the same shape, or ``(vocab,)`` broadcast over the batch.

    Raises:
        TypeError: ``mask`` is not a bool tensor.
        ValueError: shapes do not match, or a row keeps no allowed token.
    """
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {type(mask).__name__} "
                        f"{getattr(mask, 'dtype', '')}")
    if mask.shape[-1] != logits.shape[-1] or mask.dim() > logits.dim() or \
            (mask.dim() == 2 and mask.shape[0] != logits.shape[0]):
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match logits shape {tuple(logits.shape)}")
    if not mask.any(dim=-1).all():
        raise ValueError("mask must allow at least one token per row, got a row with none allowed")
    return logits.float().masked_fill(~mask.to(logits.device), float("-inf"))
