"""Activation outliers and the two classic answers, on a real layer's inputs.

From about 6.7 B parameters on, a handful of hidden channels carry activations 20–100× larger
than the rest, in every layer (Dettmers et al. 2022). Rounding activations to int8 with one
scale per tensor then spends almost all 255 levels on those channels and the others round to
a few levels. Two fixes:

* **LLM.int8()** (Dettmers et al. 2022): keep the outlier channels (``|x| > 6``) in 16 bits and
  multiply them separately; everything else in int8. Exact on the outliers, slower kernel.
* **SmoothQuant** (Xiao et al. 2023): divide channel ``j`` of the activations by
  ``s_j = max|x_j|^α / max|w_j|^(1−α)`` and multiply row ``j`` of the weight by it (``x W`` is
  unchanged in real numbers): the outlier's range migrates into the weights, which round well.

The tiny model is too small to grow such channels (its largest channel is a few times the
median), so :func:`outlier_errors` can plant one, at the size the papers measure, into the real
activations and compare the three.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..validation import check_int, check_real, check_type
from .formats import fake_quantize


@dataclass(frozen=True)
class OutlierErrors:
    """Relative error of ``x W`` (vs fp32) with int8 activations and int8 weights, per method.

    Attributes:
        per_tensor: activations with one scale per tensor, weights per output channel.
        llm_int8: the outlier channels kept in fp32, the rest as ``per_tensor``.
        smoothquant: scales migrated (α = 0.5), then as ``per_tensor``.
        outlier_ratio: the largest channel's max |x| over the median channel's.
    """

    per_tensor: float
    llm_int8: float
    smoothquant: float
    outlier_ratio: float


def plant_outlier(x: torch.Tensor, channel: int = 0, factor: float = 60.0) -> torch.Tensor:
    """A copy of activations ``x (tokens, channels)`` whose ``channel`` is scaled by ``factor``."""
    check_type("x", x, torch.Tensor)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (tokens, channels), got shape {tuple(x.shape)}")
    check_int("channel", channel, 0, x.shape[-1] - 1)
    check_real("factor", factor, 0, low_open=True)
    y = x.clone().float()
    y[:, channel] *= factor
    return y


def outlier_errors(x: torch.Tensor, w_oi: torch.Tensor, threshold: float = 6.0, alpha: float = 0.5) -> OutlierErrors:
    """Int8 ``x Wᵀ`` three ways (see :class:`OutlierErrors`).

    Args:
        x: ``(tokens, in)`` activations; w_oi: ``(out, in)`` weight.
        threshold: LLM.int8()'s outlier rule, ``max|x_j| > threshold`` (6 in the paper).
        alpha: SmoothQuant's migration strength (0.5 in the paper).

    Raises:
        ValueError: shapes that do not multiply, ``alpha`` outside [0, 1].
    """
    check_type("x", x, torch.Tensor)
    check_type("w_oi", w_oi, torch.Tensor)
    if x.dim() != 2 or w_oi.dim() != 2 or x.shape[1] != w_oi.shape[1]:
        raise ValueError(f"x (tokens, in) and w_oi (out, in) must share 'in', got {tuple(x.shape)} and {tuple(w_oi.shape)}")
    check_real("alpha", alpha, 0, 1)
    check_real("threshold", threshold, 0, low_open=True)
    x, w = x.float(), w_oi.float()
    exact = x @ w.t()
    if not torch.isfinite(exact).all() or float(exact.norm()) == 0:
        raise ValueError("x and w_oi must be finite and give a non-zero product x Wᵀ (the errors are relative to it)")
    rel = lambda y: float((y - exact).norm() / exact.norm())                       # noqa: E731
    wq = fake_quantize(w, "int8", "channel")
    per_tensor = rel(fake_quantize(x, "int8", "tensor") @ wq.t())
    outliers = x.abs().amax(dim=0) > threshold
    inliers = x.masked_fill(outliers, 0.0)
    llm_int8 = rel(fake_quantize(inliers, "int8", "tensor") @ wq.t() + x[:, outliers] @ w[:, outliers].t())
    col = x.abs().amax(dim=0).clamp_min(1e-5)
    s = col ** alpha / w.abs().amax(dim=0).clamp_min(1e-5) ** (1 - alpha)
    smooth = rel(fake_quantize(x / s, "int8", "tensor") @ fake_quantize(w * s, "int8", "channel").t())
    return OutlierErrors(per_tensor, llm_int8, smooth, float(col.max() / col.median()))
