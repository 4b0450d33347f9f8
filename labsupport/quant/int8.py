"""An int8 matmul that really runs on this CPU: PyTorch's dynamic-quantised linear (FBGEMM / oneDNN).

``Int8Linear`` stores a weight as int8 codes with one scale per output channel (a quarter of
fp32's bytes). Each call measures the absmax of the incoming rows, rounds them to int8 too
("dynamic" activation quantisation: W8A8, scales found at run time, nothing to calibrate),
multiplies int8 × int8 into int32 accumulators and scales the result back to float32. The
engine uses it for every matrix with ``quantization="int8"`` (vLLM's option name).

This is not weight-only: the activations are rounded as well (an outlier in one feature
coarsens every other of its row — the effect LLM.int8() and SmoothQuant address). The chapter
measures how much that costs in perplexity next to weight-only int8.

**Batch invariance.** The kernel picks one activation scale for the whole input tensor, so a
row's rounding would depend on the other rows of the step (other requests, a prefill chunk, a
draft) and greedy outputs with it. So each row is divided by its own absmax first and two pad
columns (−1 and +1, against zero weights) pin the tensor's range to [−1, 1]: every row is then
rounded with the same scale whatever else is in the batch, and the result is scaled back per row.
"""

from __future__ import annotations

import warnings

import torch

from ..validation import check_type

QUANTIZATIONS = (None, "int8")


def int8_available() -> bool:
    """Whether this PyTorch build has the quantised CPU kernels (FBGEMM, oneDNN or QNNPACK)."""
    return bool(torch.backends.quantized.supported_engines) and \
        any(e != "none" for e in torch.backends.quantized.supported_engines)


class Int8Linear:
    """``y = x Wᵀ + b`` with int8 weights (per output channel) and int8 activations (per call).

    Args:
        w_oi: ``(out, in)`` float weight; bias: ``(out,)`` or ``None``.

    Shapes: ``x (M, in)`` float32 → ``(M, out)`` float32.

    Raises:
        TypeError: not tensors. ValueError: not 2-D, a bias of the wrong shape, non-finite weights,
            or this build has no quantised kernels.
    """

    def __init__(self, w_oi: torch.Tensor, bias: torch.Tensor | None = None):
        check_type("w_oi", w_oi, torch.Tensor)
        if bias is not None:
            check_type("bias", bias, torch.Tensor)
        if w_oi.dim() != 2:
            raise ValueError(f"w_oi must be 2-D (out, in), got shape {tuple(w_oi.shape)}")
        if bias is not None and tuple(bias.shape) != (w_oi.shape[0],):
            raise ValueError(f"bias must have shape ({w_oi.shape[0]},), got {tuple(bias.shape)}")
        if w_oi.numel() == 0:
            raise ValueError(f"w_oi must be a non-empty matrix, got shape {tuple(w_oi.shape)}")
        if not torch.isfinite(w_oi).all() or (bias is not None and not torch.isfinite(bias).all()):
            raise ValueError("w_oi and bias must hold finite values, got NaN or inf")
        if not int8_available():
            raise ValueError("quantization='int8' needs PyTorch's quantised CPU kernels, which this build lacks")
        w = w_oi.detach().float().cpu()
        scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        padded = torch.cat([w, torch.zeros(w.shape[0], 2)], dim=1)              # zero weights for the two pads
        with warnings.catch_warnings():          # the qint8 tensor API is marked deprecated in favour of torchao
            warnings.simplefilter("ignore", UserWarning)
            codes = torch.quantize_per_channel(padded, scale, zero, 0, torch.qint8)
        self.bias = None if bias is None else bias.detach().float().cpu().contiguous()
        self.packed = torch.ops.quantized.linear_prepack(codes, None)
        self.out_features, self.in_features = w.shape
        self._buffers: dict[int, torch.Tensor] = {}
        self.nbytes = w.numel() + 4 * w.shape[0] + (0 if bias is None else 4 * bias.numel())

    @property
    def shape(self) -> tuple[int, int]:
        """``(in, out)``, like :class:`labsupport.engine.linear.Linear`."""
        return (self.in_features, self.out_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_features or x.dtype != torch.float32:
            raise ValueError(f"x must be a float32 (M, {self.in_features}) tensor, got {tuple(x.shape)} {x.dtype}")
        m = x.shape[0]
        buf = self._buffers.get(m)
        if buf is None:                                  # [x / row absmax | -1 | +1], one buffer per row count
            buf = self._buffers[m] = torch.empty(m, self.in_features + 2)
            buf[:, -2], buf[:, -1] = -1.0, 1.0
        row = torch.linalg.vector_norm(x, float("inf"), dim=1, keepdim=True).clamp_(min=1e-30)   # (M, 1)
        torch.div(x, row, out=buf[:, :self.in_features])
        y = torch.ops.quantized.linear_dynamic(buf, self.packed, True)
        return y.mul_(row) if self.bias is None else torch.addcmul(self.bias, y, row)
