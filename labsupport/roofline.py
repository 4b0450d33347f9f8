"""The roofline of an accelerator, and the step time of bandwidth-bound decoding.

Plain arithmetic (only the standard library and ``labsupport.validation``, like :mod:`labsupport.kv`,
which re-exports every name here, so ``kv.step_time`` and ``kv.H100_SXM`` keep working):

* **Roofline of prefill and decode** (Williams et al., 2009; worked for Llama 3 8B on an H100): a token
  costs ≈ ``2N`` FLOPs; a decode step must read every weight once, so at batch 1 it takes
  ``weight bytes / bandwidth``; the ridge point is ``peak FLOP/s / bandwidth``.
* **Step time of a batch** (memory-bound decoding, Pope et al., 2022): ``t(B) = (W + B·K) / BW`` and throughput
  ``B / t(B)``, saturating at ``BW / K``.

Units: bandwidths are bytes/s, FLOP rates FLOP/s, times seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from .validation import check_int, check_positive, check_real

__all__ = [
    "A100_SXM",
    "ACCELERATORS",
    "H20",
    "H100_SXM",
    "Accelerator",
    "decode_intensity",
    "decode_throughput",
    "flops_per_token",
    "prefill_time",
    "ridge_point",
    "step_time",
    "throughput_ceiling",
]


@dataclass(frozen=True)
class Accelerator:
    """Peak dense FLOP rate (FLOP/s), memory bandwidth (bytes/s) and memory (bytes)."""

    name: str
    peak_flops: float
    bandwidth: float
    memory: float

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {self.name!r}")
        for field_name in ("peak_flops", "bandwidth", "memory"):
            check_positive(field_name, getattr(self, field_name))


#: NVIDIA H100 SXM datasheet: BF16 dense ≈ 989 TFLOPS, HBM3 ≈ 3.35 TB/s, 80 GB.
H100_SXM = Accelerator("H100 SXM", peak_flops=989e12, bandwidth=3.35e12, memory=80e9)
#: NVIDIA A100 SXM 80 GB datasheet: BF16 dense 312 TFLOPS, HBM2e ≈ 2.04 TB/s.
A100_SXM = Accelerator("A100 SXM", peak_flops=312e12, bandwidth=2.04e12, memory=80e9)
#: NVIDIA H20 (a bandwidth-rich, compute-poor Hopper): BF16 dense ≈ 148 TFLOPS, HBM3 4.0 TB/s, 96 GB.
H20 = Accelerator("H20", peak_flops=148e12, bandwidth=4.0e12, memory=96e9)
#: The GPUs chapter 10 compares for prefill and decode.
ACCELERATORS = (H100_SXM, A100_SXM, H20)


def flops_per_token(n_params: int) -> float:
    """≈ ``2N`` FLOPs to push one token through a model of ``N`` parameters (one multiply + one add)."""
    check_int("n_params", n_params, 1)
    return 2.0 * n_params


def ridge_point(acc: Accelerator = H100_SXM) -> float:
    """Arithmetic intensity (FLOP/byte) where compute and bandwidth are both saturated: peak / bandwidth.

    989 / 3.35 ≈ 295 FLOP/byte on an H100.
    """
    return acc.peak_flops / acc.bandwidth


def decode_intensity(batch: int, bytes_per_param: float = 2.0) -> float:
    """FLOP/byte of a decode step that reads each weight once for ``batch`` tokens: ``2·batch / bytes``.

    With 2-byte weights this is ≈ ``batch``, ignoring the KV reads.
    """
    check_int("batch", batch, 1)
    check_positive("bytes_per_param", bytes_per_param)
    return 2.0 * batch / bytes_per_param


def prefill_time(n_tokens: int, n_params: int, acc: Accelerator = H100_SXM) -> float:
    """Ideal compute-bound prefill time in seconds: ``n_tokens · 2N / peak``.

    2,000 tokens of Llama 3 8B on an H100 ≈ 32 ms (≈ 2× that at 40–60 % MFU).
    """
    check_int("n_tokens", n_tokens, 1)
    if not isinstance(acc, Accelerator):
        raise TypeError(f"acc must be an Accelerator, got {acc!r}")
    return n_tokens * flops_per_token(n_params) / acc.peak_flops


def step_time(weight_bytes: float, bandwidth: float, batch: int = 1, kv_bytes_per_request: float = 0.0) -> float:
    """Bandwidth-bound decode step time in seconds: ``t(B) = (W + B·K) / BW``.

    Args:
        weight_bytes: ``W``, bytes of weights read once per step.
        bandwidth: ``BW``, bytes/s.
        batch: ``B``, requests in the step (each makes one token).
        kv_bytes_per_request: ``K``, bytes of KV each request reads (0 = the weights-only bound).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: ``weight_bytes`` or ``bandwidth`` not > 0, ``batch`` < 1, ``K`` < 0.
    """
    check_positive("weight_bytes", weight_bytes)
    check_positive("bandwidth", bandwidth)
    check_int("batch", batch, 1)
    check_real("kv_bytes_per_request", kv_bytes_per_request, 0)
    return (weight_bytes + batch * kv_bytes_per_request) / bandwidth


def decode_throughput(weight_bytes: float, bandwidth: float, batch: int = 1,
                      kv_bytes_per_request: float = 0.0) -> float:
    """Tokens/s of bandwidth-bound decoding: ``B / t(B) = B·BW / (W + B·K)``."""
    return batch / step_time(weight_bytes, bandwidth, batch, kv_bytes_per_request)


def throughput_ceiling(kv_bytes_per_request: float, bandwidth: float) -> float:
    """Limit of :func:`decode_throughput` as ``B → ∞``: ``BW / K`` tokens/s (3.3 TB/s / 0.25 GB ≈ 13,200)."""
    check_positive("kv_bytes_per_request", kv_bytes_per_request)
    check_positive("bandwidth", bandwidth)
    return bandwidth / kv_bytes_per_request
