"""Quantisation at scale, computed: weights and KV of Llama 3 8B / 70B per format, what fits one
80 GB GPU, and the bandwidth-bound decode step of :func:`labsupport.kv.step_time`.

Bytes per weight: bf16 2, fp8 / int8 1 (one scale per output channel: negligible), int4 with
one fp16 scale per group of 128 weights ``(4 + 16/128) / 8 = 0.516`` (GPTQ's / AWQ's layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..kv import H100_SXM, Accelerator, kv_bytes_per_token, preset, step_time
from ..validation import check_choice, check_int

WEIGHT_BITS = {"bf16": 16.0, "fp8": 8.0, "int8": 8.0, "int4": 4.0 + 16.0 / 128}
KV_FORMATS = ("fp16", "fp8", "int8")


@dataclass(frozen=True)
class ScaleRow:
    """One model in one weight format and one KV format on one accelerator.

    Attributes:
        weight_bytes: bytes of the weights. kv_per_token: KV bytes of one token (all layers).
        fits: the weights fit the accelerator's memory with room for KV.
        kv_tokens: tokens of KV that fit beside the weights (0 if they do not fit).
        step_s: bandwidth-bound decode step (seconds) at ``batch`` requests of ``context`` tokens.
    """

    model: str
    weight_format: str
    kv_format: str
    weight_bytes: float
    kv_per_token: int
    fits: bool
    kv_tokens: int
    step_s: float


def at_scale(models: Sequence[str] = ("Llama 3 8B", "Llama 3 70B"),
             weight_formats: Sequence[str] = ("bf16", "fp8", "int8", "int4"), kv_format: str = "fp16",
             acc: Accelerator = H100_SXM, batch: int = 1, context: int = 8192) -> list[ScaleRow]:
    """A :class:`ScaleRow` per model and weight format.

    Llama 3 70B in bf16 is ~141 GB: it does not fit one 80 GB GPU; in int4 (~36 GB) it does, and
    its decode step bound falls from ≈ 42 ms to ≈ 11 ms (plus the KV read).

    Raises:
        ValueError: an unknown model, format, or ``batch`` / ``context`` < 1.
    """
    check_choice("kv_format", kv_format, KV_FORMATS)
    for name, value in (("models", models), ("weight_formats", weight_formats)):
        if isinstance(value, str) or not hasattr(value, "__iter__"):
            raise TypeError(f"{name} must be a sequence of names, got {value!r}")
    if not isinstance(acc, Accelerator):
        raise TypeError(f"acc must be a labsupport.kv.Accelerator (e.g. kv.H100_SXM), got {acc!r}")
    check_int("batch", batch, 1)
    check_int("context", context, 1)
    rows = []
    for name in models:
        shape = preset(name)
        for fmt in weight_formats:
            check_choice("weight_formats", fmt, WEIGHT_BITS)
            weights = shape.n_params * WEIGHT_BITS[fmt] / 8
            per_token = kv_bytes_per_token(shape, kv_format)
            free = acc.memory - weights
            fits = free > 0
            rows.append(ScaleRow(name, fmt, kv_format, weights, per_token, fits,
                                 int(free // per_token) if fits else 0,
                                 step_time(weights, acc.bandwidth, batch, per_token * context)))
    return rows
