"""KV-cache quantisation: each cached key and value vector stored in 8 bits with its own scale.

``kv_cache_dtype`` (vLLM's option) is ``"auto"`` (the model's dtype: fp32 here), ``"int8"``,
``"fp8"`` (= ``"fp8_e4m3"``) or ``"fp8_e5m2"``. One scale per token and head (the absmax of that
head's ``head_dim`` values, stored in fp16) — fine enough that one outlier token does not coarsen
the rest of its block, and only ``2 / head_dim`` extra bytes per value. A block then holds the
same tokens in about a quarter of fp32's bytes, so a memory budget holds ~4× the tokens.

The paged cache keeps the codes in a ``uint8`` / ``int8`` tensor of the usual shape
``(layers, 2, blocks, block_size, heads, head_dim)`` and the scales beside it,
``(layers, 2, blocks, block_size, heads)``; attention gathers both and dequantises the gathered
keys and values just before the product (as vLLM's fp8 KV path does in its attention kernel).
"""

from __future__ import annotations

import torch

from ..validation import check_choice, check_int, check_type
from .formats import SCALE_MAX, SCALE_MIN

KV_CACHE_DTYPES = ("auto", "int8", "fp8", "fp8_e4m3", "fp8_e5m2")
_FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# The fp16 scale range of formats.py: a vector whose values are all below SCALE_MIN / 2 is stored as
# zeros (an absolute error under 3.1e-5); one may hold values up to SCALE_MAX · code_max (8.3e6 in int8).


def max_value(kv_cache_dtype: str) -> float:
    """The largest |value| an 8-bit cache stores (its fp16 scale times its largest code)."""
    return SCALE_MAX * code_max(kv_cache_dtype)


def check_kv_cache_dtype(kv_cache_dtype: str) -> str:
    """``kv_cache_dtype`` if valid. Raises ValueError naming the choices."""
    return check_choice("kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES)


def check_compress(name: str, compress) -> str | None:
    """A KV transfer's ``compress``: ``None`` or an 8-bit ``kv_cache_dtype``.

    Raises:
        TypeError: not ``None`` or a string. ValueError: another string (the message lists the choices).
    """
    if compress is None:
        return None
    if not isinstance(compress, str):
        raise TypeError(f"{name} must be None or one of {list(KV_CACHE_DTYPES[1:])}, got {compress!r} "
                        f"({type(compress).__name__})")
    return check_choice(name, compress, KV_CACHE_DTYPES[1:])


def storage_dtype(kv_cache_dtype: str) -> torch.dtype | None:
    """The dtype the codes are stored in (``None`` for ``"auto"``: the model's own)."""
    check_kv_cache_dtype(kv_cache_dtype)
    if kv_cache_dtype == "auto":
        return None
    return torch.int8 if kv_cache_dtype == "int8" else torch.uint8      # fp8 bits kept as bytes


def code_max(kv_cache_dtype: str) -> float:
    """The largest code magnitude: 127 for int8, 448 for E4M3, 57,344 for E5M2."""
    check_kv_cache_dtype(kv_cache_dtype)
    if kv_cache_dtype == "int8":
        return 127.0
    return float(torch.finfo(_FP8[kv_cache_dtype]).max)


def quantize_kv(x: torch.Tensor, kv_cache_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scales of ``x (..., head_dim)``: ``x ≈ codes · scale``, one scale per vector.

    Returns:
        ``codes`` (``x``'s shape, int8 or uint8 holding fp8 bits) and ``scale`` (``x.shape[:-1]``,
        float16).

    Raises:
        TypeError: ``x`` not a floating tensor. ValueError: ``"auto"`` (nothing to quantise),
            or NaN / inf in ``x``.
    """
    check_type("x", x, torch.Tensor)
    if check_kv_cache_dtype(kv_cache_dtype) == "auto":
        raise ValueError("kv_cache_dtype 'auto' stores values as they are: there is nothing to quantise")
    if not x.is_floating_point() or x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"x must be a float16/bfloat16/float32/float64 tensor, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension (head_dim), got shape {tuple(x.shape)}")
    x = x.float()
    if not torch.isfinite(x).all():
        raise ValueError("x must hold finite keys / values, got NaN or inf")
    absmax = x.abs().amax(dim=-1, keepdim=True)
    if x.numel() and float(absmax.max()) > max_value(kv_cache_dtype):
        raise ValueError(f"x must hold values within ±{max_value(kv_cache_dtype):.3g} for kv_cache_dtype="
                         f"{kv_cache_dtype!r} (fp16 scales), got {float(absmax.max()):.3g}")
    scale = (absmax / code_max(kv_cache_dtype)).clamp(SCALE_MIN, SCALE_MAX).half()
    y = x / scale.float()
    if kv_cache_dtype == "int8":
        codes = y.round().clamp(-127, 127).to(torch.int8)
    else:
        limit = code_max(kv_cache_dtype)
        codes = y.clamp(-limit, limit).to(_FP8[kv_cache_dtype]).view(torch.uint8)
    return codes, scale.squeeze(-1)


def dequantize_kv(codes: torch.Tensor, scale: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """The float32 vectors ``codes · scale`` (``scale`` broadcast over the last dimension).

    Raises:
        TypeError: not tensors. ValueError: ``"auto"``, or ``scale`` not ``codes.shape[:-1]``.
    """
    check_type("codes", codes, torch.Tensor)
    check_type("scale", scale, torch.Tensor)
    if check_kv_cache_dtype(kv_cache_dtype) == "auto":
        raise ValueError("kv_cache_dtype 'auto' has no codes to dequantise")
    if tuple(scale.shape) != tuple(codes.shape[:-1]):
        raise ValueError(f"scale must have shape codes.shape[:-1] = {tuple(codes.shape[:-1])}, got {tuple(scale.shape)}")
    if kv_cache_dtype == "int8":
        values = codes.float()
    else:
        values = codes.view(_FP8[kv_cache_dtype]).float()
    return values * scale.unsqueeze(-1).float()


# ----------------------------------------------------------------------------- the paged cache

def write_quantized(kv_cache: torch.Tensor, scales: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    slot_mapping: torch.Tensor, kv_cache_dtype: str) -> None:
    """Quantise new keys/values ``(N, H, D)`` into one layer's cache ``(2, NB, bs, H, D)`` and
    their scales into ``(2, NB, bs, H)``, at flat slots ``slot_mapping (N,)``."""
    _, num_blocks, block_size, heads, dim = kv_cache.shape
    codes = kv_cache.view(2, num_blocks * block_size, heads, dim)
    flat_scales = scales.view(2, num_blocks * block_size, heads)
    for i, x in enumerate((k, v)):
        c, s = quantize_kv(x, kv_cache_dtype)
        codes[i].index_copy_(0, slot_mapping, c)
        flat_scales[i].index_copy_(0, slot_mapping, s)


def gather_dequantized(kv_cache: torch.Tensor, scales: torch.Tensor, block_tables: torch.Tensor,
                       num_slots: int | None, kv_cache_dtype: str,
                       dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's keys and values through its block table, dequantised: ``(B, H, K, D)`` each in
    ``dtype`` (the queries' dtype; the quantised twin of :func:`labsupport.engine.attention.gather_kv`)."""
    _, _, block_size, heads, dim = kv_cache.shape
    num_seqs, max_blocks = block_tables.shape
    flat = block_tables.reshape(-1)
    codes = kv_cache.index_select(1, flat).view(2, num_seqs, max_blocks * block_size, heads, dim)[:, :, :num_slots]
    sc = scales.index_select(1, flat).view(2, num_seqs, max_blocks * block_size, heads)[:, :, :num_slots]
    kv = dequantize_kv(codes, sc, kv_cache_dtype).to(dtype).transpose(2, 3)   # (2, B, H, K, D)
    return kv[0], kv[1]


# ----------------------------------------------------------------------------- a memory budget

def kv_bytes_per_token(num_layers: int, num_heads: int, head_dim: int, kv_cache_dtype: str,
                       model_bytes: int = 4) -> int:
    """KV bytes of one token, all layers: ``2·L·H·D·bytes`` (8-bit: ``2·L·H·(D + 2)``, scales included).

    The tiny target (L = 4, H = 4, D = 64): fp32 8,192 B, int8 / fp8 2,112 B (3.88× fewer).
    """
    for name, value in (("num_layers", num_layers), ("num_heads", num_heads), ("head_dim", head_dim),
                        ("model_bytes", model_bytes)):
        check_int(name, value, 1)
    per_head = head_dim * model_bytes if check_kv_cache_dtype(kv_cache_dtype) == "auto" else head_dim + 2
    return 2 * num_layers * num_heads * per_head
