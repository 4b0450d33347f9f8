"""``y = x W + b`` for the runner's matrices, with the kernel measured fastest for the row count.

A decode step multiplies one row per sequence by every weight matrix: it reads each weight byte
once and does almost no arithmetic, so its cost is the time to stream the weights. Verifying γ
drafted tokens multiplies γ + 1 rows by the *same* weights — in principle nearly the same cost,
which is why speculative decoding can pay. Whether it does depends on the kernel that runs the
product, and which kernel is fastest depends on the machine. Three ways to compute it on CPU
(one torch thread, median ms):

=====================================================  =====  =====  =====  =====  =====  =====
rows M                                                   1      2      4      5      8     16
=====================================================  =====  =====  =====  =====  =====  =====
*AMD EPYC, MKL: a whole forward of the tiny target over M new tokens*
``x W`` (W in×out, the model's layout)                  1.17   1.52   1.88   2.19   2.32   3.80
``Wᵀ xᵀ`` (a contiguous out×in copy)                    1.45   1.20   1.33   1.73   2.44   4.30
oneDNN, weights prepacked once                          1.52   2.02   2.05   2.03   2.33   2.73
*Intel Xeon (AVX-512), MKL: the 16 layer matrices only*
``x W``                                                 0.49   0.55   0.61   0.63   0.78   1.08
``Wᵀ xᵀ``                                               0.52   0.98   1.02   1.04   1.08   1.12
oneDNN prepacked                                        0.85   0.89   0.91   0.93   1.09   1.39
=====================================================  =====  =====  =====  =====  =====  =====

On the EPYC four rows cost 1.6× one row with ``x W`` and 1.1× with ``Wᵀ xᵀ``; on the Xeon
``x W`` costs 1.25× and ``Wᵀ xᵀ`` 2×: the opposite choice. So no fixed rule is right. The runner
*measures*, once per machine and matrix shape (:func:`tune`, about 0.8 s for the tiny target, then
read from a cache file), the fastest kernel at each row bucket (:data:`ROW_BUCKETS`) and keeps only
the weight copies the chosen kernels read. All give the same numbers up to float rounding (the engine's logits equal
Hugging Face's within 1e-4, tested). On a GPU, or before tuning, ``x W`` on the model's own
layout is used and no copy is made. ``python -m labsupport.bench engine`` prints the choices and
``bench speculative`` the verification cost v(γ) they give on the machine at hand.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import platform
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from ..timing import time_call
from ..validation import check_bool, check_choice, check_int
from .batch_invariant import tiled_matmul

KERNELS = ("x W", "Wᵀ xᵀ", "oneDNN")
"""The three ways :class:`Linear` can compute ``x W + b`` (module docstring)."""

ROW_BUCKETS = (1, 2, 4, 8, 16, 64)
"""Row counts :func:`tune` times; ``M`` rows use the kernel of the smallest bucket ``≥ M`` (the
largest bucket's for more rows)."""

_TUNED: dict[tuple, dict[int, str]] = {}
"""Choices measured in this process, by matrix shape, dtype, bias and thread count."""


def _prepack(w_oi: torch.Tensor):
    """oneDNN's blocked copy of an out×in float32 matrix, or None where this build lacks the ops."""
    if w_oi.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w_oi, 8)
        x = torch.ones(3, w_oi.shape[1])
        if not torch.allclose(torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
                              x @ w_oi.t(), rtol=1e-4, atol=1e-4):
            return None
        return packed
    except (AttributeError, RuntimeError):
        return None


def bucket_of(m: int) -> int:
    """The :data:`ROW_BUCKETS` entry whose kernel runs ``m`` rows (the largest one past it).

    Raises:
        TypeError: ``m`` not an integer.
        ValueError: ``m`` < 1.
    """
    check_int("m", m, 1)
    return next((b for b in ROW_BUCKETS if b >= m), ROW_BUCKETS[-1])


class Linear:
    """One weight matrix and its bias, multiplied by the kernel chosen for the row count.

    Args:
        weight: ``(in, out)`` (GPT-2's ``Conv1D`` layout: ``y = x @ weight``) or, with
            ``out_in=True``, ``(out, in)`` (``nn.Linear`` and the tied LM head).
        bias: ``(out,)`` or ``None``.
        out_in: the layout of ``weight``.

    It starts on ``x W``. Each kernel reads its own copy of the weights (in×out — the model's own
    tensor where it already is one —, a contiguous out×in copy, oneDNN's packed blocks), made the
    first time the kernel runs or is chosen; :meth:`choose` (called by :func:`tune`) fixes the
    kernel per row bucket and drops the copies no chosen kernel reads. Shapes: ``x (M, in)`` →
    ``(M, out)``, contiguous.

    Raises:
        TypeError: ``weight`` / ``bias`` not tensors, ``out_in`` not a bool. ValueError: ``weight``
            not 2-D, or ``bias`` not ``(out,)``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, out_in: bool = False):
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a tensor, got {type(weight).__name__}")
        if bias is not None and not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a tensor or None, got {type(bias).__name__}")
        check_bool("out_in", out_in)
        if weight.dim() != 2:
            raise ValueError(f"weight must be 2-D, got shape {tuple(weight.shape)}")
        out = weight.shape[0] if out_in else weight.shape[1]
        if bias is not None and tuple(bias.shape) != (out,):
            raise ValueError(f"bias must have shape ({out},), got {tuple(bias.shape)}")
        self.bias = None if bias is None else bias.contiguous()           # oneDNN reads it as a flat array
        self.bias_col = None if bias is None else self.bias.unsqueeze(1)  # (out, 1) for Wᵀ xᵀ
        self.in_features, self.out_features = (weight.shape[1], weight.shape[0]) if out_in else weight.shape
        self.dtype = weight.dtype
        self.weight, self.out_in = weight, out_in
        self.w_io = self.w_oi = self.packed = None                        # the kernels' copies, made on demand
        cpu = weight.device.type == "cpu"
        dnn = cpu and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
        self._available = KERNELS if dnn else KERNELS[:2] if cpu else KERNELS[:1]
        self._kernel = ["x W"] * (ROW_BUCKETS[-1] + 1)                   # by row count, 0 … largest bucket
        self.batch_invariant = False
        self._copy("x W")

    @property
    def shape(self) -> tuple[int, int]:
        """``(in, out)``."""
        return (self.in_features, self.out_features)

    @property
    def kernels(self) -> tuple[str, ...]:
        """The kernels this matrix can run (only ``x W`` on a GPU)."""
        return self._available

    @property
    def choices(self) -> dict[int, str]:
        """``{row bucket: kernel}`` in use."""
        return {b: self._kernel[b] for b in ROW_BUCKETS}

    @property
    def copies(self) -> tuple[str, ...]:
        """The kernels whose copy of the weights is held now."""
        return tuple(k for k, w in zip(KERNELS, (self.w_io, self.w_oi, self.packed)) if w is not None)

    def _copy(self, kernel: str):
        """The weights as ``kernel`` reads them, made once.

        Raises:
            ValueError: a kernel this matrix cannot run.
        """
        check_choice("kernel", kernel, self.kernels)
        w = self.weight
        if kernel == "x W":
            if self.w_io is None:
                w_io = w.t() if self.out_in else w
                self.w_io = w_io.contiguous() if w.device.type == "cpu" else w_io   # x W wants in×out in memory
            return self.w_io
        if self.w_oi is None and kernel in ("Wᵀ xᵀ", "oneDNN"):
            self.w_oi = w.contiguous() if self.out_in else w.t().contiguous()
        if kernel == "Wᵀ xᵀ":
            return self.w_oi
        if self.packed is None:
            self.packed = _prepack(self.w_oi)
            if self.packed is None:                                       # this build cannot: x W only
                self._available = tuple(k for k in self._available if k != "oneDNN")
                raise ValueError("kernel 'oneDNN' is not available in this torch build")
        return self.packed

    def choose(self, choices: Mapping[int, str], prune: bool = True) -> None:
        """Use ``choices[bucket]`` for the rows of each bucket (missing buckets keep theirs), making
        the chosen kernels' copies now; with ``prune`` drop the copies no chosen kernel reads.

        Raises:
            ValueError: a bucket not in :data:`ROW_BUCKETS` or a kernel this matrix cannot run.
        """
        for b, k in choices.items():
            check_choice("bucket", b, ROW_BUCKETS)
            check_choice("kernel", k, self.kernels)
        by_bucket = {**self.choices, **choices}
        rows = range(1, ROW_BUCKETS[-1] + 1)
        self._kernel = [by_bucket[1]] + [by_bucket[bucket_of(m)] for m in rows]     # index 0: an empty x
        used = set(self._kernel)
        for k in used:
            self._copy(k)
        if prune:
            if "Wᵀ xᵀ" not in used:
                self.w_oi = None
            if "oneDNN" not in used:
                self.packed = None
            if "x W" not in used:
                self.w_io = None

    def run(self, x: torch.Tensor, kernel: str) -> torch.Tensor:
        """``x W + b`` by the named kernel (one of :attr:`kernels`; its copy is made on first use)."""
        if kernel == "x W":
            w = self.w_io if self.w_io is not None else self._copy(kernel)
            return x @ w if self.bias is None else torch.addmm(self.bias, x, w)
        if kernel == "oneDNN":
            w = self.packed if self.packed is not None else self._copy(kernel)
            return torch.ops.mkldnn._linear_pointwise(x, w, self.bias, "none", [], "")
        if kernel != "Wᵀ xᵀ":
            check_choice("kernel", kernel, self.kernels)
        w = self.w_oi if self.w_oi is not None else self._copy(kernel)
        y = w @ x.t() if self.bias is None else torch.addmm(self.bias_col, w, x.t())
        return y.t().contiguous()                                         # (out, M) → (M, out)

    def use_batch_invariant(self) -> None:
        """From now on every call runs ``x W`` on fixed tiles of rows (:func:`~labsupport.engine.batch_invariant.tiled_matmul`):
        a row's result no longer depends on the rows that came with it. The other kernels' copies are dropped."""
        self.choose(dict.fromkeys(ROW_BUCKETS, "x W"))
        self.batch_invariant = True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch_invariant:
            return tiled_matmul(x, self.w_io, self.bias)
        m = x.shape[0]
        return self.run(x, self._kernel[m if m <= ROW_BUCKETS[-1] else -1])


def _key(lin: Linear) -> tuple:
    return (lin.shape, lin.dtype, lin.bias is None, torch.get_num_threads())


def _passes(linears: list[Linear], steps: list[tuple[torch.Tensor, str]], repeats: int) -> float:
    """Median seconds of ``steps`` (rows, kernel), each run through every matrix of ``linears``,
    repeated back to back after one untimed round (a kernel's steady state, as an engine runs it)."""
    def one_round() -> None:
        for x, k in steps:
            for lin in linears:
                lin.run(x, k)

    return time_call(one_round, repeats=repeats, warmup=1).median


@torch.inference_mode()
def measure(linears: list[Linear], m: int, after: str | None = None, repeats: int = 3,
            rounds: int = 3) -> dict[str, float]:
    """Seconds of each kernel on ``m`` rows through every matrix of ``linears`` (one shape).

    With ``after`` (the one-row kernel), each timed step is a one-row pass with ``after``
    followed by the ``m``-row pass with the kernel under test, and the one-row pass's time is
    subtracted: decode steps and verification steps alternate in speculative decoding, and
    switching kernels between them costs time of its own (on a Xeon a 5-row forward took
    1.47 ms with ``x W`` throughout but 2.08 ms when the one-row steps ran ``Wᵀ xᵀ``).
    Kernels are timed in blocks (:func:`_passes`) of ``repeats`` passes — more where needed for
    a block to last :data:`MIN_TIMED` —, the blocks alternating over ``rounds``; the median is kept.

    Returns:
        ``{kernel: seconds}`` for one pass; with ``after`` the difference of two timings, so on
        matrices too small to time it can come out a hair below zero.

    Raises:
        ValueError: no matrices, ``m`` / ``repeats`` / ``rounds`` < 1, or ``after`` not a kernel
            of these matrices. TypeError: any of them not an integer.
    """
    if not linears:
        raise ValueError("linears must hold at least one matrix, got none")
    check_int("m", m, 1)
    if after is not None:
        check_choice("after", after, linears[0].kernels)
    check_int("repeats", repeats, 1)
    check_int("rounds", rounds, 1)
    lin = linears[0]
    x = torch.randn(m, lin.in_features, dtype=lin.dtype)
    one = torch.randn(1, lin.in_features, dtype=lin.dtype)
    one_pass = _passes(linears, [(x, "x W")], 1)
    repeats = max(repeats, math.ceil(MIN_TIMED / max(one_pass, 1e-7)))
    times: dict[str, list[float]] = {k: [] for k in lin.kernels}
    for _ in range(rounds):
        base = _passes(linears, [(one, after)], repeats) if after else 0.0
        for k, t in times.items():
            steps = [(one, after), (x, k)] if after else [(x, k)]
            t.append(_passes(linears, steps, repeats) - base)
    return {k: statistics.median(t) for k, t in times.items()}


MIN_TIMED = 1e-3
"""Seconds each timed pass of :func:`measure` is repeated for at least (its ``repeats`` are raised to
fill it). Measured on a Xeon, 8 processes each way, alternating: with a fixed 3 repeats a pass of
the LM head alone (0.15 ms at one row) came out up to 10 % off by chance, 6 of 8 processes chose
some kernel other than ``x W`` (once the LM head's one-row kernel), and the runner's v(4) was 1.25
(1.20–1.31), v(8) 1.55 (1.51–1.80); with this floor 1 of 8, v(4) 1.20 (1.17–1.24), v(8) 1.52
(1.47–1.57), for about 0.45 s more per process. A near-tie at 64 rows (prefill) can still flip."""

MARGIN = 0.05
"""A kernel other than ``x W`` (the model's own layout, no extra copy) is chosen only if it is at
least this much faster: near-ties would otherwise flip between runs and mix kernels."""


def _choose(linears: list[Linear], repeats: int) -> dict[int, str]:
    def fastest(t: dict[str, float]) -> str:
        best = min(t, key=t.get)
        return best if t[best] < (1 - MARGIN) * t["x W"] else "x W"
    first = fastest(measure(linears, 1, repeats=repeats))
    # verification-sized steps (γ + 1 rows, or a token tree of up to 16) alternate with one-row steps;
    # prefill-sized ones are timed alone, in fewer rounds
    return {1: first, **{b: fastest(measure(linears, b, after=first, repeats=repeats) if b <= 16 else
                                    measure(linears, b, repeats=1, rounds=2)) for b in ROW_BUCKETS[1:]}}


def cache_path() -> Path:
    """The per-machine file of kernel choices: ``$LABSUPPORT_CACHE_DIR/linear-kernels.json``
    (default ``~/.cache/labsupport``)."""
    root = os.environ.get("LABSUPPORT_CACHE_DIR") or Path.home() / ".cache" / "labsupport"
    return Path(root) / "linear-kernels.json"


@functools.cache
def machine_key() -> str:
    """What a kernel choice depends on besides the shape: the CPU, the torch build and its math libraries
    (read once per process)."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    return f"{cpu} | {platform.machine()} | torch {torch.__version__} | mkldnn {torch.backends.mkldnn.is_available()}"


def _cached() -> dict:
    with contextlib.suppress(OSError, ValueError):
        stored = json.loads(cache_path().read_text())
        return stored.get(machine_key(), {}) if isinstance(stored, dict) else {}
    return {}


def _store(key: tuple, choice: dict[int, str]) -> bool:
    """Add one shape's choice to the machine's entry (written whole, then renamed); False if it cannot be written."""
    path = cache_path()
    try:
        stored = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        stored = {}
    stored = stored if isinstance(stored, dict) else {}
    stored.setdefault(machine_key(), {})[repr(key)] = {str(b): k for b, k in choice.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(stored, indent=1, sort_keys=True))
        tmp.replace(path)
        return True
    except OSError:
        return False


#: Where each shape's choice came from in this process: ``"cached"`` (this machine's file), ``"measured"``
#: (timed now and stored) or ``"measured, not stored"`` (the file could not be written).
SOURCES: dict[tuple, str] = {}


def tune(linears: Iterable[Linear], repeats: int = 3) -> dict[tuple, dict[int, str]]:
    """Choose each matrix's kernel per row bucket, **once per machine** for each matrix shape: from
    this machine's cache file (:func:`cache_path`, keyed by :func:`machine_key`) when it holds the
    shape, else by timing the kernels (:func:`measure`: first the one-row kernel, then each bucket's
    in alternation with it) and storing the choice. Kernels round differently, so a choice timed
    anew in each process could give a seeded request other tokens in another process; read from
    one file, every process on the machine computes alike. Drop the weight copies not chosen.
    Matrices on a GPU, or with only one kernel, keep ``x W``.

    Returns:
        ``{(shape, dtype, no bias, threads): {bucket: kernel}}`` for the shapes given.
    """
    groups: dict[tuple, list[Linear]] = {}
    for lin in linears:
        if len(lin.kernels) > 1:
            groups.setdefault(_key(lin), []).append(lin)
    cached = _cached() if any(key not in _TUNED for key in groups) else {}
    for key, group in groups.items():
        if key not in _TUNED:
            stored = cached.get(repr(key))
            if isinstance(stored, dict) and all(k in group[0].kernels for k in stored.values()) and \
                    {int(b) for b in stored} == set(ROW_BUCKETS):
                _TUNED[key], SOURCES[key] = {int(b): k for b, k in stored.items()}, "cached"
            else:
                _TUNED[key] = _choose(group, repeats)
                SOURCES[key] = "measured" if _store(key, _TUNED[key]) else "measured, not stored"
        for lin in group:
            lin.choose(_TUNED[key])
    return {key: dict(_TUNED[key]) for key in groups}
