"""Number formats and the one quantiser every part of the chapter uses.

A format trades bytes for precision and range:

=============  ====  ============  =====================================================
format          bits  largest       what a step looks like
=============  ====  ============  =====================================================
``fp32``         32   3.4e38        relative step 2⁻²³ ≈ 1.2e-7 (the reference)
``bf16``         16   3.4e38        fp32's range, 7 mantissa bits: relative step 2⁻⁷
``fp16``         16   65,504        10 mantissa bits (2⁻¹⁰), a smaller range
``fp8_e4m3``      8   448           3 mantissa bits (2⁻³): weights and activations (OCP FP8)
``fp8_e5m2``      8   57,344        2 mantissa bits (2⁻²): fp16's range, gradients
``int8``          8   127·scale     255 evenly spaced levels between ±absmax
``int4``          4   7·scale       15 levels (symmetric, −7 … 7)
=============  ====  ============  =====================================================

Integer formats (and the scaled fp8 formats) need a **scale**: ``x ≈ scale · code``, with
``scale = absmax / qmax`` chosen per *tensor* (one number), per output *channel* (one per row
of the weight) or per *group* of ``group_size`` consecutive inputs of a row (GPTQ's and AWQ's
int4 layout, usually 128). A finer scale follows the data more closely and costs more scale
bytes (stored as fp16: 2 bytes each). ``bf16`` / ``fp16`` / ``fp32`` store the values
directly: no scale.

Reference: Micikevicius et al. 2022, *FP8 Formats for Deep Learning* (E4M3 / E5M2); Dettmers et
al. 2022, *LLM.int8()* (absmax int8, outliers); Frantar et al. 2023 (GPTQ) and Lin et al. 2024
(AWQ) for the per-group int4 layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..validation import check_choice, check_int, check_type

FORMATS = ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")
GRANULARITIES = ("tensor", "channel", "group")
SCALE_BYTES = 2
"""Bytes of one stored scale (fp16, as GPTQ / AWQ checkpoints and vLLM's int kernels keep them)."""

_TORCH_FLOAT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class NumberFormat:
    """One format: its bits, kind, the largest code and the relative spacing of its values.

    Attributes:
        name: one of :data:`FORMATS`.
        bits: bits per stored value.
        kind: ``"float"`` or ``"int"``.
        max_code: the largest magnitude a code can hold (448 for E4M3, 127 for int8).
        rel_step: for floats, the gap between 1 and the next value (``2^-mantissa_bits``);
            for ints, one level as a fraction of the range (``1 / max_code``).
        scaled: whether values are stored as ``scale · code`` (int and fp8 formats).
    """

    name: str
    bits: int
    kind: str
    max_code: float
    rel_step: float
    scaled: bool

    @property
    def bytes_per_value(self) -> float:
        return self.bits / 8


def number_format(name: str) -> NumberFormat:
    """The :class:`NumberFormat` called ``name``.

    Raises:
        ValueError: ``name`` not one of :data:`FORMATS`.
    """
    check_choice("fmt", name, FORMATS)
    if name.startswith("int"):
        bits = int(name[3:])
        qmax = 2 ** (bits - 1) - 1
        return NumberFormat(name, bits, "int", float(qmax), 1.0 / qmax, True)
    info = torch.finfo(_TORCH_FLOAT[name])
    return NumberFormat(name, info.bits, "float", float(info.max), float(info.eps), name.startswith("fp8"))


def format_table() -> list[NumberFormat]:
    """Every format of :data:`FORMATS`, in that order (the chapter's table)."""
    return [number_format(name) for name in FORMATS]


@dataclass
class QuantizedTensor:
    """A 2-D tensor stored as codes and scales: ``x ≈ codes · scale`` (see the module docstring).

    Attributes:
        codes: ``(rows, cols)``: int8 values for int8/int4 (int4 codes in −7 … 7 are held one per
            byte here; :attr:`nbytes` counts them as 4 bits, as a packed kernel stores them), a
            float8 / 16-bit / 32-bit tensor for the float formats.
        scale: ``(rows, groups)`` float32 (already rounded to fp16), or ``None`` for unscaled formats.
        fmt, granularity, group_size: how it was made (``group_size`` = columns per scale).
    """

    codes: torch.Tensor
    scale: torch.Tensor | None
    fmt: str
    granularity: str
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self) -> torch.Tensor:
        """The float32 values the codes stand for, ``(rows, cols)``."""
        x = self.codes.float()
        if self.scale is None:
            return x
        rows, cols = x.shape
        return (x.view(rows, cols // self.group_size, self.group_size) * self.scale.unsqueeze(-1)).view(rows, cols)

    @property
    def nbytes(self) -> int:
        """Bytes as stored: ``bits/8`` per value (4-bit values packed two per byte) + 2 per scale."""
        value_bits = number_format(self.fmt).bits * self.codes.numel()
        return -(-value_bits // 8) + (0 if self.scale is None else SCALE_BYTES * self.scale.numel())


def _check_matrix(x) -> torch.Tensor:
    check_type("x", x, torch.Tensor)
    if x.dim() not in (1, 2) or x.numel() == 0:
        raise ValueError(f"x must be a non-empty 1-D or 2-D tensor, got shape {tuple(x.shape)}")
    if not x.is_floating_point() or x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"x must be a float16/bfloat16/float32/float64 tensor, got {x.dtype}")
    y = x.detach().float()
    if not torch.isfinite(y).all():
        raise ValueError("x must hold finite float32 values, got NaN or inf (or a float64 beyond float32's range)")
    return y.reshape(1, -1) if y.dim() == 1 else y


SCALE_MIN, SCALE_MAX = 2.0 ** -14, 65504.0
"""The range of a stored fp16 scale: groups whose absmax is below ``SCALE_MIN · q_max / 2`` round to
zero (an absolute error under that), and values beyond ``SCALE_MAX · q_max`` cannot be stored."""


def quantize(x: torch.Tensor, fmt: str = "int8", granularity: str = "channel", group_size: int = 128) -> QuantizedTensor:
    """Round ``x`` to ``fmt`` with absmax scales (round to nearest, symmetric).

    Args:
        x: ``(rows, cols)`` float weights, a row per output channel (``nn.Linear``'s layout;
            pass ``W.T`` for GPT-2's ``Conv1D``), or a 1-D tensor (one row).
        fmt: one of :data:`FORMATS`.
        granularity: ``"tensor"`` (one scale), ``"channel"`` (one per row) or ``"group"`` (one per
            ``group_size`` consecutive columns of a row). Unscaled formats ignore it (recorded as is).
        group_size: columns per scale with ``"group"``; must divide ``cols``.

    Returns:
        a :class:`QuantizedTensor`; ``.dequantize()`` gives the rounded values.

    Raises:
        TypeError: ``x`` not a floating-point tensor, ``group_size`` not an int.
        ValueError: unknown ``fmt`` / ``granularity``, ``group_size`` < 1 or not dividing the
            row width, an empty ``x``, or ``x`` holding NaN / inf.
    """
    info = number_format(fmt)
    check_choice("granularity", granularity, GRANULARITIES)
    x = _check_matrix(x)
    rows, cols = x.shape
    if granularity == "group":
        group_size = check_int("group_size", group_size, 1)
        if cols % group_size:
            raise ValueError(f"group_size must divide the row width {cols}, got {group_size}")
    else:
        group_size = cols
    if not info.scaled:
        if float(x.abs().max()) > info.max_code:
            raise ValueError(f"x must hold values within ±{info.max_code:.6g} to be stored in {fmt}, "
                             f"got {float(x.abs().max()):.3g}")
        return QuantizedTensor(x.to(_TORCH_FLOAT[fmt]), None, fmt, granularity, group_size)
    groups = x.view(rows, cols // group_size, group_size)
    absmax = groups.abs().amax(dim=-1)                                   # (rows, groups)
    if granularity == "tensor":
        absmax = absmax.amax().expand(rows, 1).clone()
    if float(absmax.max()) > SCALE_MAX * info.max_code:
        raise ValueError(f"x must hold values within ±{SCALE_MAX * info.max_code:.3g} for {fmt} with fp16 scales, "
                         f"got {float(absmax.max()):.3g}")
    scale = (absmax / info.max_code).clamp(SCALE_MIN, SCALE_MAX).half().float()   # stored as fp16
    scaled = groups / scale.unsqueeze(-1)
    if info.kind == "int":
        codes = scaled.round().clamp(-info.max_code, info.max_code).to(torch.int8)
    else:
        codes = scaled.clamp(-info.max_code, info.max_code).to(_TORCH_FLOAT[fmt])
    return QuantizedTensor(codes.view(rows, cols), scale, fmt, granularity, group_size)


def fake_quantize(x: torch.Tensor, fmt: str = "int8", granularity: str = "channel", group_size: int = 128) -> torch.Tensor:
    """``quantize(x, …).dequantize()`` in ``x``'s shape: the values a quantised kernel computes with."""
    return quantize(x, fmt, granularity, group_size).dequantize().view(x.shape)


def relative_error(x: torch.Tensor, approx: torch.Tensor) -> float:
    """``‖x − approx‖ / ‖x‖`` (Frobenius norms): 0 is exact; int8 per channel on a weight ≈ 0.5 %.

    Raises:
        ValueError: shapes differ, or ``x`` is all zeros.
    """
    check_type("x", x, torch.Tensor)
    check_type("approx", approx, torch.Tensor)
    if x.shape != approx.shape:
        raise ValueError(f"approx must have x's shape {tuple(x.shape)}, got {tuple(approx.shape)}")
    norm = float(x.float().norm())
    if norm == 0:
        raise ValueError("x must not be all zeros (the relative error is undefined)")
    return float((x.float() - approx.float()).norm()) / norm
