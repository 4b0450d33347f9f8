"""``y = x W + b`` for the runner's matrices, with the kernel chosen by how many rows ``x`` has.

A decode step multiplies one row per sequence by every weight matrix: it reads each weight byte
once and does almost no arithmetic, so its cost is the time to stream the weights from memory.
Verifying γ drafted tokens multiplies γ + 1 rows by the *same* weights — in principle nearly the
same cost (the bandwidth floor), which is why speculative decoding can pay. Whether it does
depends on the kernel that runs the product. Measured in the runner (a whole forward of the
tiny target over M new tokens of one sequence, MKL, one torch thread, 25 alternating repeats,
median ms):

====================================================  =====  =====  =====  =====  =====  =====
rows M                                                  1      2      4      5      8     16
====================================================  =====  =====  =====  =====  =====  =====
``addmm(b, x, W)``, W in×out (the model's layout)      1.17   1.52   1.88   2.19   2.32   3.80
``addmm(b, Wᵀ, xᵀ)ᵀ``, a contiguous out×in copy         1.45   1.20   1.33   1.73   2.44   4.30
oneDNN, weights prepacked once (``mkldnn`` linear)     1.52   2.02   2.05   2.03   2.33   2.73
====================================================  =====  =====  =====  =====  =====  =====

(The three were timed in one process, alternating, on a 2-core laptop-class VM; rows of the
same column are comparable, columns of different runs less so.) So on CPU the runner picks,
per call: one row → ``x W``; 2 – :data:`SMALL_M` rows → ``Wᵀ xᵀ`` (the kernel streams the
weights once for all rows); more rows (a long draft or tree, prefill, big batches) → the
prepacked oneDNN kernel, whose cost barely grows with M. All give the same numbers up to float
rounding (the engine's logits equal Hugging Face's within 1e-4, tested). Where oneDNN is
missing or the weights are not float32 the last case falls back to ``x W``; on a GPU the
model's layout is used as is and no copy is made. One more copy on CPU: a matrix given out×in
(the tied LM head, 4,096 × 256) also keeps a contiguous in×out copy for the one-row case —
``x W`` on the transposed view took 310 µs a row, on the copy 148 µs (median of 30, caches
flushed between calls), 1.08× a whole decode step (paired, median of 9; 1.01–1.29). ``python -m labsupport.bench engine`` and
``bench speculative`` re-measure the step and v(γ) on the machine at hand.
"""

from __future__ import annotations

import torch

from ..validation import check_int

SMALL_M = 4
"""Most rows for which ``Wᵀ xᵀ`` is used (above it the prepacked kernel wins, table above)."""


def _prepack(w_oi: torch.Tensor):
    """oneDNN's blocked copy of an out×in float32 matrix, or None where this build lacks the ops."""
    if w_oi.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w_oi, 8)
        x = torch.ones(SMALL_M + 1, w_oi.shape[1])
        if not torch.allclose(torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
                              x @ w_oi.t(), rtol=1e-4, atol=1e-4):
            return None
        return packed
    except (AttributeError, RuntimeError):
        return None


class Linear:
    """One weight matrix and its bias, multiplied by the kernel that suits the row count.

    Args:
        weight: ``(in, out)`` (GPT-2's ``Conv1D`` layout: ``y = x @ weight``) or, with
            ``out_in=True``, ``(out, in)`` (``nn.Linear`` and the tied LM head).
        bias: ``(out,)`` or ``None``.
        out_in: the layout of ``weight``.
        small_m: most rows for the ``Wᵀ xᵀ`` kernel (above: prepacked oneDNN). A wide matrix
            such as the LM head (4,096 × 256) wants oneDNN from 2 rows: 82 / 118 / 173 µs at
            2 / 4 / 8 rows against 177 / 225 / 412 µs for ``Wᵀ xᵀ`` (median of 40), so the
            runner gives it ``small_m=1``.

    Shapes: ``x (M, in)`` → ``(M, out)``, contiguous.

    Raises:
        TypeError: ``weight`` / ``bias`` not tensors. ValueError: ``weight`` not 2-D, or ``bias``
            not ``(out,)``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, out_in: bool = False,
                 small_m: int = SMALL_M):
        if not isinstance(weight, torch.Tensor) or (bias is not None and not isinstance(bias, torch.Tensor)):
            raise TypeError(f"weight and bias must be tensors, got {type(weight).__name__}, {type(bias).__name__}")
        if weight.dim() != 2:
            raise ValueError(f"weight must be 2-D, got shape {tuple(weight.shape)}")
        out = weight.shape[0] if out_in else weight.shape[1]
        if bias is not None and tuple(bias.shape) != (out,):
            raise ValueError(f"bias must have shape ({out},), got {tuple(bias.shape)}")
        self.bias = None if bias is None else bias.contiguous()           # oneDNN reads it as a flat array
        self.w_io = weight.t() if out_in else weight                      # (in, out), a view
        self.w_oi = self.packed = None
        if weight.device.type == "cpu":                                   # a contiguous out×in copy
            self.w_oi = weight if out_in and weight.is_contiguous() else self.w_io.t().contiguous()
            self.packed = _prepack(self.w_oi)
            if not self.w_io.is_contiguous():                             # one row: x W wants W in×out in memory
                self.w_io = self.w_io.contiguous()
        self.bias_col = None if bias is None else bias.unsqueeze(1)       # (out, 1)
        self.small_m = check_int("small_m", small_m, 1)

    @property
    def shape(self) -> tuple[int, int]:
        """``(in, out)``."""
        return tuple(self.w_io.shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        if self.w_oi is None or m == 1 or (m > self.small_m and self.packed is None):   # GPU, one row, fallback
            return x @ self.w_io if self.bias is None else torch.addmm(self.bias, x, self.w_io)
        if m > self.small_m:                                              # many rows: prepacked oneDNN
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        y = self.w_oi @ x.t() if self.bias is None else torch.addmm(self.bias_col, self.w_oi, x.t())
        return y.t().contiguous()                                         # (out, M) → (M, out)
