"""Paged attention that reads the KV blocks in place: the engine's ``CPU_ATTN`` backend.

:mod:`labsupport.engine.attention` computes paged attention *by gather*: it copies each
sequence's blocks into one contiguous tensor, then calls torch's
``scaled_dot_product_attention`` (``TORCH_SDPA``). That copy reads and writes every cached
key and value of the batch once per layer and step before attention reads them again. A
serving engine's kernel (vLLM's ``CPU_ATTN`` on a CPU, its CUDA kernels on a GPU) follows the
block table and reads each key and value where it lies instead. ``paged_attention.c`` beside
this file is such a kernel for float32 on the CPU — about 100 lines of C, the same maths as
``attention.py`` — compiled on first use with the machine's C compiler (a fraction of a second;
the library is kept in ``~/.cache/labsupport``) and called through :mod:`ctypes`.

Measured on a 2-core AMD EPYC, one thread, one layer of the tiny target (4 heads of 64), block
size 16, median of 30 calls, the kernel called as the runner calls it (write of the new K/V included
in both):

==========================================  ==============  =================
sequences × context (new tokens each)        gather + SDPA   in place (CPU_ATTN)
==========================================  ==============  =================
1 × 40 (decode)                                  38 µs              3 µs
8 × 150 (decode)                                212 µs             69 µs
32 × 150 (decode)                               878 µs            305 µs
1 × 150 (5: verifying 4 drafted tokens)          74 µs             39 µs
8 × 150 (5)                                     357 µs            326 µs
1 × 0 (a 134-token prompt)                      407 µs           1806 µs
==========================================  ==============  =================

The kernel takes causal chains of up to :data:`MAX_QUERY_LEN` new tokens per sequence; the engine
gives it every decode step and short verifications (:func:`takes_step`: one dot product per query and
key loses to SDPA's matrix products once several sequences verify several tokens). Prompts, token
trees (their mask is not causal), 8-bit KV and GPUs use ``TORCH_SDPA``. Where no C compiler is found
the engine says why (:func:`unavailable_reason`) and uses ``TORCH_SDPA``: same numbers, slower.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from ..validation import check_real
from .attention import check_metadata

SOURCE = Path(__file__).with_name("paged_attention.c")
"""The kernel's C source, shipped with the package."""

ATTENTION_BACKENDS = ("TORCH_SDPA", "CPU_ATTN")
"""vLLM's names: gather + torch's SDPA (:mod:`labsupport.engine.attention`), or the in-place kernel."""

MAX_QUERY_LEN = 16
"""Most new tokens of one sequence that ``CPU_ATTN`` attends for in a step: one to decode, γ + 1
to verify a draft. Longer prefill chunks use ``TORCH_SDPA``, whose blocked kernel does the
``Q × C`` scores as matrix products (a 134-token prompt: 407 µs against 1.8 ms in place)."""

MAX_HEAD_DIM = 256
"""Largest head size the kernel takes (``D_MAX`` in ``paged_attention.c``; GPT-2's is 64 at every size)."""

MAX_MULTI_QUERY_TOKENS = 8
"""Most new tokens a step with several per sequence (verification) may have for ``CPU_ATTN`` to take it.
The kernel computes one dot product per query, head and key, while SDPA does a sequence's queries as
one matrix product, so SDPA catches up as queries pile up. Measured (µs, gather + SDPA / in place,
one layer, context 150, AMD EPYC): 2 new tokens × 1/4/8 sequences 60/30, 146/88, 248/160;
5 × 1/2/4 73/58, 112/105, 184/201; 9 × 1 87/99; 16 × 1 100/179. Decode steps (one new token per
sequence) always take ``CPU_ATTN``; see :func:`takes_step`."""

FLAGS = (["-O3", "-march=native", "-fopenmp-simd"], ["-O3"])
"""Compiler flags tried in order: vector instructions of the machine at hand, then plain."""


def _compiler() -> str | None:
    """The C compiler: ``$CC``, then the one Python was built with, then ``cc`` / ``gcc`` / ``clang``."""
    names = [os.environ.get("CC", ""), (sysconfig.get_config_var("CC") or "").split(" ")[0], "cc", "gcc", "clang"]
    return next((shutil.which(n) for n in names if n and shutil.which(n)), None)


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "labsupport"


def _machine_tag() -> str:
    """What ``-march=native`` depends on: the CPU's instruction-set flags where Linux lists them."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), platform.processor())
    except OSError:
        return platform.processor() + platform.machine()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _intact(target: Path) -> bool:
    """A kept library whose bytes match the digest written beside it when it was built: a file cut
    short (a crash or a full disk while writing) would kill the process that loads it (SIGBUS)."""
    stamp = target.with_name(target.name + ".sha256")
    try:
        return target.is_file() and stamp.read_text().strip() == _digest(target)
    except OSError:
        return False


def _write_durably(path: Path, data: bytes | None = None) -> None:
    """Write ``data`` (or just flush an existing file) to disk before it is renamed into place."""
    with open(path, "wb" if data is not None else "ab") as f:
        if data is not None:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _build(cc: str) -> Path:
    """Compile :data:`SOURCE` into a shared library, kept (with its digest) in the first writable of
    ``~/.cache/labsupport`` and the temp folder, keyed by source, compiler and CPU; a kept library
    that does not match its digest is built again.

    Raises:
        RuntimeError: every set of :data:`FLAGS` failed; the message names the compiler, its exit
            status and the end of its output.
    """
    key = hashlib.sha256(SOURCE.read_bytes() + cc.encode() + _machine_tag().encode() + sys.platform.encode())
    folders = []
    for folder in (_cache_dir(), Path(tempfile.gettempdir()) / "labsupport"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK | os.X_OK):
                folders.append(folder)
        except OSError:
            continue
    if not folders:
        raise RuntimeError(f"no writable folder for the compiled kernel ({_cache_dir()} or the temp folder)")
    errors = []
    for flags in FLAGS:
        name = f"paged_attention-{key.copy().hexdigest()[:16]}-{'-'.join(f.strip('-') for f in flags)}.so"
        kept = next((f / name for f in folders if _intact(f / name)), None)
        if kept is not None:
            return kept
        target = folders[0] / name
        tmp = target.with_name(f"{name}.{os.getpid()}.tmp")
        try:
            done = subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", str(tmp), str(SOURCE)],
                                  capture_output=True, text=True, timeout=60, check=False)
            if done.returncode == 0:
                _write_durably(tmp)
                _write_durably(tmp.with_name(tmp.name + ".sha256"), _digest(tmp).encode())
                os.replace(tmp, target)                # atomic: another process may build the same file
                os.replace(tmp.with_name(tmp.name + ".sha256"), target.with_name(name + ".sha256"))
                return target
            errors.append(f"{cc} {' '.join(flags)} exited with {done.returncode}: "
                          f"{done.stderr.strip()[-300:] or '(no output)'}")
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the C compiler {cc} did not finish within 60 s") from None
        except OSError as exc:
            errors.append(f"{cc} {' '.join(flags)}: {exc}")
        finally:
            for leftover in (tmp, tmp.with_name(tmp.name + ".sha256")):
                try:
                    leftover.unlink(missing_ok=True)
                except OSError:
                    pass
    raise RuntimeError("the C compiler failed: " + " | ".join(errors))


def _self_test(fn) -> None:
    """Run the kernel once on a small ragged batch (a prompt chunk, decodes, a short context) against
    :func:`labsupport.engine.attention.paged_attention`.

    Raises:
        RuntimeError: the results differ (a miscompiled library is never used)."""
    from .attention import build_metadata, paged_attention

    g = torch.Generator().manual_seed(0)
    heads, dim, bs, blocks = 2, 8, 4, 12
    cache = torch.randn(2, blocks, bs, heads, dim, generator=g)
    ref_cache = cache.clone()
    meta = build_metadata([3, 1, 2], [5, 9, 0], [[4, 7], [1, 2, 11], [6]], bs)
    qkv = torch.randn(6, 3, heads, dim, generator=g)
    q, k, v = qkv.unbind(1)
    expected = paged_attention(q, k, v, ref_cache, meta, 0.3)
    out = paged_attention_in_place(qkv.view(6, -1), cache, meta, 0.3, torch.empty(3 * heads * 10), fn=fn)
    if not (torch.allclose(out, expected, atol=1e-5) and torch.equal(cache, ref_cache)):
        raise RuntimeError("the compiled kernel's self-test gave results that differ from attention.py")


@lru_cache(maxsize=1)
def _load():
    """``(function, None)`` or ``(None, why it is unavailable)``; built and tested once per process."""
    if os.environ.get("LABSUPPORT_NO_NATIVE", "") not in ("", "0"):
        return None, f"switched off by LABSUPPORT_NO_NATIVE={os.environ['LABSUPPORT_NO_NATIVE']}"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found (looked for $CC, cc, gcc and clang)"
    try:
        lib = ctypes.CDLL(str(_build(cc)))
        fn = lib.paged_attention_f32
        p = ctypes.c_void_p
        fn.argtypes = [ctypes.POINTER(StepPlan), p, p, ctypes.c_float, p]
        fn.restype = None
        _self_test(fn)
    except (OSError, RuntimeError, AttributeError) as exc:
        return None, str(exc)
    return fn, None


def unavailable_reason() -> str | None:
    """Why ``CPU_ATTN`` cannot run here (no compiler, a failed build or self-test), or ``None``."""
    return _load()[1]


def default_backend_line() -> str:
    """What a float32 CPU engine with the default ``attention_backend`` runs here, for benchmark headers."""
    why = unavailable_reason()
    return "attention CPU_ATTN (KV blocks read in place)" if why is None else \
        f"attention TORCH_SDPA (gather; CPU_ATTN unavailable: {why})"


def check_backend_name(attention_backend) -> str | None:
    """``attention_backend`` if it is ``None`` or one of :data:`ATTENTION_BACKENDS`.

    Raises:
        TypeError: not a string or None. ValueError: an unknown name.
    """
    if attention_backend is not None and not isinstance(attention_backend, str):
        raise TypeError(f"attention_backend must be None or one of {list(ATTENTION_BACKENDS)}, got "
                        f"{attention_backend!r} ({type(attention_backend).__name__})")
    if attention_backend is not None and attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be None or one of {list(ATTENTION_BACKENDS)}, got {attention_backend!r}")
    return attention_backend


def resolve_backend(attention_backend: str | None, device: torch.device, dtype: torch.dtype,
                    kv_cache_dtype: str = "auto", head_dim: int = 64) -> str:
    """The backend a runner uses: ``None`` picks ``CPU_ATTN`` where it can run (float32 KV on the
    CPU, heads of at most :data:`MAX_HEAD_DIM`, the kernel built), else ``TORCH_SDPA``.

    Raises:
        ValueError: an unknown name, or ``CPU_ATTN`` asked for where it cannot run (the message says why).
    """
    check_backend_name(attention_backend)
    if attention_backend == "TORCH_SDPA":
        return attention_backend
    if device.type != "cpu" or dtype != torch.float32 or kv_cache_dtype != "auto":
        why = f"it runs float32 KV on the CPU, got {dtype} on {device.type} with kv_cache_dtype={kv_cache_dtype!r}"
    elif head_dim > MAX_HEAD_DIM:
        why = f"it takes heads of at most {MAX_HEAD_DIM} numbers, got {head_dim}"
    else:
        why = unavailable_reason()
    if why is None:
        return "CPU_ATTN"
    if attention_backend == "CPU_ATTN":
        raise ValueError(f"attention_backend='CPU_ATTN' cannot run here: {why}")
    return "TORCH_SDPA"


def takes_step(query_lens, tree: bool = False) -> bool:
    """Whether a ``CPU_ATTN`` runner attends a step in place: no token tree, and one new token per
    sequence (decode, any batch) or at most :data:`MAX_MULTI_QUERY_TOKENS` new tokens in all (verifying
    a short draft at batch 1 or 2); the rest (prompts, longer or wider verification) gathers."""
    return not tree and (max(query_lens) == 1 or sum(query_lens) <= MAX_MULTI_QUERY_TOKENS)


class StepPlan(ctypes.Structure):
    """What every layer of one step shares, for the kernel (``StepPlan`` in ``paged_attention.c``): the
    cache's shape, pointers to the step's metadata tensors and to the score scratch. Built once per
    step by :func:`plan`, so each layer's call passes five arguments instead of fifteen (ctypes
    converts every argument on every call: 7 µs a call with fifteen, against a 5 µs kernel)."""

    _fields_ = [("num_blocks", ctypes.c_int64), ("block_size", ctypes.c_int64), ("heads", ctypes.c_int64),
                ("dim", ctypes.c_int64), ("slots", ctypes.c_void_p), ("tables", ctypes.c_void_p),
                ("max_blocks", ctypes.c_int64), ("query_lens", ctypes.c_void_p), ("context_lens", ctypes.c_void_p),
                ("num_seqs", ctypes.c_int64), ("scores", ctypes.c_void_p)]


def plan(meta, cache_shape: tuple[int, ...], scores: torch.Tensor):
    """The :class:`StepPlan` of one step: ``meta`` (its tensors must outlive the plan), one layer's cache
    shape ``(2, num_blocks, block_size, H, D)``, the score scratch. No checks: see :func:`paged_attention_in_place`."""
    _, num_blocks, block_size, heads, dim = cache_shape
    return ctypes.pointer(StepPlan(num_blocks, block_size, heads, dim, meta.slot_mapping.data_ptr(),
                                   meta.block_tables.data_ptr(), meta.block_tables.shape[1], meta.lens[0].data_ptr(),
                                   meta.lens[1].data_ptr(), meta.num_seqs, scores.data_ptr()))


def kernel():
    """The compiled kernel (``paged_attention_f32``), or ``None`` where :func:`unavailable_reason` says why."""
    return _load()[0]


def _check_inputs(qkv, layer_cache, meta, scale, scores) -> None:
    """Everything the kernel reads, checked on the tensors it reads (it follows raw pointers: a
    block id or length out of range would read or write outside the pool)."""
    for name, t in (("qkv", qkv), ("layer_cache", layer_cache), ("scores", scores)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float32 tensor on the CPU, got {t.dtype} on "
                             f"{t.device.type}{'' if t.is_contiguous() else ', not contiguous'}")
    check_real("scale", scale)
    if layer_cache.dim() != 5 or layer_cache.shape[0] != 2:
        raise ValueError(f"layer_cache must have shape (2, num_blocks, block_size, H, D), got {tuple(layer_cache.shape)}")
    _, num_blocks, block_size, heads, dim = layer_cache.shape
    if dim > MAX_HEAD_DIM:
        raise ValueError(f"CPU_ATTN takes heads of at most {MAX_HEAD_DIM} numbers, got {dim}")
    if meta.tree or meta.max_query_len > MAX_QUERY_LEN:
        raise ValueError(f"CPU_ATTN runs causal chains of at most {MAX_QUERY_LEN} new tokens per sequence, got "
                         f"{'a token tree' if meta.tree else f'{meta.max_query_len} new tokens'}")
    check_metadata(meta, num_blocks, block_size)
    n = sum(meta.query_lens)
    if tuple(qkv.shape) != (n, 3 * heads * dim):
        raise ValueError(f"qkv must have shape ({n}, {3 * heads * dim}) (new tokens, 3·H·D), got {tuple(qkv.shape)}")
    if scores.numel() < meta.max_query_len * heads * meta.max_context_len:
        raise ValueError(f"scores must hold at least {meta.max_query_len * heads * meta.max_context_len} numbers, "
                         f"got {scores.numel()}")


def paged_attention_in_place(qkv: torch.Tensor, layer_cache: torch.Tensor, meta, scale: float,
                             scores: torch.Tensor, *, fn=None) -> torch.Tensor:
    """Write the new tokens' K/V into their slots and attend over each sequence's blocks in place.

    Args:
        qkv: ``(N, 3·H·D)`` float32, contiguous: each new token's q, k and v (GPT-2's ``c_attn`` output).
        layer_cache: one layer's cache ``(2, num_blocks, block_size, H, D)``, float32, contiguous;
            changed in place (the new K/V).
        meta: the step's :class:`~labsupport.engine.attention.AttentionMetadata` (causal chains, no tree,
            at most :data:`MAX_QUERY_LEN` new tokens per sequence).
        scale: score scale, ``1/√D`` for GPT-2.
        scores: float32 scratch of at least ``max_query_len · H · max_context_len`` numbers.
        fn: the kernel (default :func:`kernel`).

    Returns:
        ``(N, H·D)`` attention output, heads concatenated — what
        :func:`~labsupport.engine.attention.paged_attention` returns for the same input.

    Raises:
        TypeError: a tensor argument that is not a tensor, a ``scale`` that is not a number.
        ValueError: the kernel is unavailable, a tensor of another dtype, device, layout or size, a
            block id or slot outside the pool, metadata whose tensors disagree with its lengths, or a token tree. (The model runner checks its metadata once per step
            and calls the kernel through :func:`plan` without these checks.)
    """
    fn = fn or kernel()
    if fn is None:
        raise ValueError(f"attention_backend='CPU_ATTN' cannot run here: {unavailable_reason()}")
    _check_inputs(qkv, layer_cache, meta, scale, scores)
    heads, dim = layer_cache.shape[3:]
    out = torch.empty(meta.slot_mapping.numel(), heads * dim)
    fn(plan(meta, tuple(layer_cache.shape), scores), qkv.data_ptr(), layer_cache.data_ptr(), scale, out.data_ptr())
    return out
