"""Closed-form serving arithmetic: KV reservation waste and batching utilisation.

These are the back-of-the-envelope numbers the chapters recompute before they measure the
real engine (``labsupport.engine``) or run a simulator (``labsupport.sim``):

* contiguous reservation vs paged allocation (PagedAttention, Kwon et al., 2023): how much of
  a max-length reservation a request really uses, how many requests fit in a KV budget;
* static vs continuous batching (Orca, Yu et al., 2022): slot-step utilisation of a static
  batch and the ideal continuous-batching speed-up.

The step-time model ``t(B) = (W + B·K) / BW`` lives in :mod:`labsupport.kv`
(``step_time``, ``decode_throughput``, ``throughput_ceiling``); TTFT, TPOT, throughput and
goodput under an SLO in :mod:`labsupport.engine.metrics`.

Pure Python: no torch, no plotting.

Units. Byte sizes are plain numbers of bytes; ``KiB = 1024``, ``MiB = 1024 KiB``. The default
example (Llama 3 8B, fp16 KV) has 128 KiB of KV per token, so a 2048-token reservation is
2048 × 128 KiB = 256 MiB. Its 60 GB of KV memory is counted as 60,000 MiB
(:data:`H100_KV_MEMORY_BYTES`) so that 60 GB / 256 MB gives the round 234 requests usually
quoted; with 60·10⁹ bytes it is 223 — the ratios (≈ 15 %, ≈ 7×) do not depend on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .kv import PRESETS, kv_bytes_per_token
from .kv import blocks_needed as _blocks_needed
from .validation import check_int, check_positive

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: Llama 3 8B (32 layers, 8 KV heads of 128, GQA) stores 128 KiB of KV per token in fp16,
#: computed by :func:`labsupport.kv.kv_bytes_per_token` (2 · 32 layers · 8 KV heads · 128 · 2 B).
LLAMA3_8B_KV_BYTES_PER_TOKEN = kv_bytes_per_token(PRESETS["Llama 3 8B"], "fp16")
#: Naive serving reserves the maximum context for every request: 2048 tokens.
MAX_CONTEXT_TOKENS = 2048
#: A typical request ends at 300 tokens (prompt + output).
TYPICAL_USED_TOKENS = 300
#: 60 GB of memory for KV (roughly what an 80 GB H100 keeps free beside Llama 3 8B's 16 GB of
#: bf16 weights and its workspace), counted as 60,000 MiB (see the module docstring).
H100_KV_MEMORY_BYTES = 60_000 * MiB
#: vLLM's default block size (tokens per block).
VLLM_BLOCK_SIZE = 16
#: A static batch of 8: four requests of 50 output tokens and four of 400.
BIMODAL_BATCH_SIZE = 8
BIMODAL_OUTPUT_LENS = (50, 50, 50, 50, 400, 400, 400, 400)



# ----------------------------------------------------------------------------- reservation

def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Physical blocks a paged KV cache allocates for ``num_tokens`` tokens: ⌈tokens / block_size⌉.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: ``num_tokens`` < 0 or ``block_size`` < 1.
    """
    check_int("num_tokens", num_tokens, 0)
    check_int("block_size", block_size, 1)
    return _blocks_needed(num_tokens, block_size)


def requests_that_fit(memory_bytes: float, bytes_per_request: float) -> int:
    """How many requests of ``bytes_per_request`` fit in ``memory_bytes``: ⌊memory / per request⌋.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: either argument is not > 0.
    """
    check_positive("memory_bytes", memory_bytes)
    check_positive("bytes_per_request", bytes_per_request)
    return int(memory_bytes // bytes_per_request)


@dataclass(frozen=True)
class ReservationReport:
    """One request under contiguous reservation and under paged allocation (bytes, tokens).

    Attributes:
        reserved_bytes: contiguous reservation, ``reserved_tokens × kv_bytes_per_token``.
        used_bytes: KV actually written, ``used_tokens × kv_bytes_per_token``.
        utilisation: ``used_bytes / reserved_bytes`` (default example: 37.5 / 256 ≈ 15 %).
        paged_blocks: blocks a paged cache allocates, ``⌈used_tokens / block_size⌉``.
        paged_bytes: ``paged_blocks × block_size × kv_bytes_per_token``.
        paged_waste_tokens: empty slots in the last block for this length.
        paged_waste_bound_tokens: worst case over all lengths, ``block_size − 1`` (default example: 15).
        requests_contiguous / requests_exact / requests_paged: how many such requests fit in
            ``memory_bytes`` (default example: 234 / ≈ 1,600 / ≥ 1,000).
    """

    kv_bytes_per_token: float
    reserved_tokens: int
    used_tokens: int
    block_size: int
    memory_bytes: float
    reserved_bytes: float
    used_bytes: float
    utilisation: float
    paged_blocks: int
    paged_bytes: float
    paged_waste_tokens: int
    paged_waste_bound_tokens: int
    requests_contiguous: int
    requests_exact: int
    requests_paged: int

    @property
    def used_by_contiguous_batch_bytes(self) -> float:
        """KV the contiguous batch really uses: ``requests_contiguous × used_bytes`` (default example ≈ 8.8 GB)."""
        return self.requests_contiguous * self.used_bytes

    @property
    def capacity_gain(self) -> float:
        """``requests_exact / requests_contiguous`` (default example: ≈ 7×)."""
        return self.requests_exact / self.requests_contiguous if self.requests_contiguous else math.inf

    @property
    def paged_waste_bound_bytes(self) -> float:
        """``(block_size − 1) × kv_bytes_per_token`` (default example: 15 × 128 KB ≈ 1.9 MB)."""
        return self.paged_waste_bound_tokens * self.kv_bytes_per_token


def reservation_report(kv_bytes_per_token: float = LLAMA3_8B_KV_BYTES_PER_TOKEN,
                       reserved_tokens: int = MAX_CONTEXT_TOKENS,
                       used_tokens: int = TYPICAL_USED_TOKENS,
                       memory_bytes: float = H100_KV_MEMORY_BYTES,
                       block_size: int = VLLM_BLOCK_SIZE) -> ReservationReport:
    """Contiguous max-length reservation vs paged allocation for one typical request.

    Default example (Kwon et al., 2023, §2–3): 2048 × 128 KiB = 256 MiB reserved vs
    300 × 128 KiB = 37.5 MiB used, ≈ 15 %; 60 GB holds 234 requests vs ≈ 1,600; block 16
    wastes ≤ 15 tokens.

    Args:
        kv_bytes_per_token: KV bytes one token occupies (all layers, K and V).
        reserved_tokens: tokens reserved per request (the maximum context).
        used_tokens: tokens the request really holds when it finishes (prompt + output).
        memory_bytes: memory available for KV.
        block_size: tokens per block of the paged cache.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a size is not positive, or ``used_tokens > reserved_tokens``.
    """
    check_positive("kv_bytes_per_token", kv_bytes_per_token)
    check_int("reserved_tokens", reserved_tokens, 1)
    check_int("used_tokens", used_tokens, 1)
    check_positive("memory_bytes", memory_bytes)
    check_int("block_size", block_size, 1)
    if used_tokens > reserved_tokens:
        raise ValueError(f"used_tokens must be <= reserved_tokens ({reserved_tokens}), got {used_tokens}")
    reserved = reserved_tokens * kv_bytes_per_token
    used = used_tokens * kv_bytes_per_token
    blocks = blocks_needed(used_tokens, block_size)
    paged = blocks * block_size * kv_bytes_per_token
    return ReservationReport(
        kv_bytes_per_token=kv_bytes_per_token, reserved_tokens=reserved_tokens, used_tokens=used_tokens,
        block_size=block_size, memory_bytes=memory_bytes, reserved_bytes=reserved, used_bytes=used,
        utilisation=used / reserved, paged_blocks=blocks, paged_bytes=paged,
        paged_waste_tokens=blocks * block_size - used_tokens, paged_waste_bound_tokens=block_size - 1,
        requests_contiguous=requests_that_fit(memory_bytes, reserved),
        requests_exact=requests_that_fit(memory_bytes, used),
        requests_paged=requests_that_fit(memory_bytes, paged))


def internal_waste_fraction(lengths: Sequence[int], block_size: int) -> float:
    """Fraction of allocated paged slots left empty: Σ(⌈L/bs⌉·bs − L) / Σ ⌈L/bs⌉·bs.

    Args:
        lengths: tokens held by each sequence (≥ 1 each).
        block_size: tokens per block.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: empty ``lengths``, a length < 1, or ``block_size`` < 1.
    """
    if len(lengths) == 0:
        raise ValueError("lengths must hold at least one sequence length, got an empty sequence")
    allocated = sum(blocks_needed(check_int(f"lengths[{i}]", n, 1), block_size) * block_size
                    for i, n in enumerate(lengths))
    return (allocated - sum(int(n) for n in lengths)) / allocated


# ----------------------------------------------------------------------------- batching

@dataclass(frozen=True)
class BatchingReport:
    """Static batching in slot-steps, against ideal continuous batching (Yu et al., 2022).

    Attributes:
        useful_slot_steps: Σ output lengths — slot-steps that produced a token (default example: 1,800).
        occupied_slot_steps: ``batch_size × static_steps`` (default example: 8 × 400 = 3,200).
        utilisation: useful / occupied (default example: ≈ 56 %).
        static_steps: Σ over consecutive batches of the longest output in the batch (default example: 400).
        continuous_steps: ``useful / batch_size`` — every slot always busy (default example: 225).
        speedup: ``static_steps / continuous_steps = 1 / utilisation`` (default example: ≈ 1.78×).
    """

    batch_size: int
    useful_slot_steps: int
    occupied_slot_steps: int
    utilisation: float
    static_steps: int
    continuous_steps: float
    speedup: float


def batching_report(output_lens: Sequence[int] = BIMODAL_OUTPUT_LENS,
                    batch_size: int = BIMODAL_BATCH_SIZE) -> BatchingReport:
    """Slot-step utilisation of static batching and the ideal continuous-batching speed-up.

    Static batching takes the requests in order, ``batch_size`` at a time; each batch runs
    until its longest request ends (a decode step makes one token per live slot). Ideal
    continuous batching refills a slot the step it frees, so ``Σ lengths / batch_size``
    steps make the same tokens (the queue never runs dry; with a finite queue the last
    requests leave a tail — ``labsupport.sim.batching`` simulates that).

    Default example (batch 8, 4 × 50 + 4 × 400: 1,800 / 3,200 ≈ 56 %, 400 / 225 ≈ 1.78×).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: empty ``output_lens``, a length < 1, or ``batch_size`` < 1.
    """
    check_int("batch_size", batch_size, 1)
    if len(output_lens) == 0:
        raise ValueError("output_lens must hold at least one request, got an empty sequence")
    lens = [check_int(f"output_lens[{i}]", n, 1) for i, n in enumerate(output_lens)]
    static_steps = sum(max(lens[i:i + batch_size]) for i in range(0, len(lens), batch_size))
    useful = sum(lens)
    occupied = batch_size * static_steps
    continuous = useful / batch_size
    return BatchingReport(batch_size=batch_size, useful_slot_steps=useful, occupied_slot_steps=occupied,
                          utilisation=useful / occupied, static_steps=static_steps,
                          continuous_steps=continuous, speedup=static_steps / continuous)


def bimodal_lengths(batch_size: int, short: int, long: int) -> list[int]:
    """Half the batch ``short`` tokens, half ``long`` (4 × 50 + 4 × 400 for 8, 50, 400).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: ``batch_size`` < 2 or not even, or a length < 1.
    """
    check_int("batch_size", batch_size, 2)
    if batch_size % 2:
        raise ValueError(f"batch_size must be even, got {batch_size}")
    check_int("short", short, 1)
    check_int("long", long, 1)
    return [short] * (batch_size // 2) + [long] * (batch_size // 2)
