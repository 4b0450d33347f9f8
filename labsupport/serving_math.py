"""Closed-form serving arithmetic of seed 000 §5.3: KV reservation waste and batching utilisation.

These are the back-of-the-envelope numbers the chapters recompute before they measure the
real engine (``labsupport.engine``) or run a simulator (``labsupport.sim``):

* contiguous reservation vs paged allocation (seed 000 §5.3.6–5.3.7): how much of a
  max-length reservation a request really uses, how many requests fit in a KV budget;
* static vs continuous batching (seed 000 §5.3.4): slot-step utilisation of a static batch
  and the ideal continuous-batching speed-up.

The step-time model ``t(B) = (W + B·K) / BW`` lives in :mod:`labsupport.kv`
(``step_time``, ``decode_throughput``, ``throughput_ceiling``); TTFT, TPOT, throughput and
goodput under an SLO in :mod:`labsupport.engine.metrics`.

Pure Python: no torch, no plotting.

Units. Byte sizes are plain numbers of bytes; ``KiB = 1024``, ``MiB = 1024 KiB``. The seed
writes "128 KB" per token and "2048 × 128 KB = 256 MB", i.e. binary KB and MB, but divides
"60 GB / 256 MB = 234", i.e. 60 GB = 60,000 MB. :data:`SEED_KV_MEMORY_BYTES` follows that
convention so the seed's numbers come out; the ratios (≈ 15 %, ≈ 7×) do not depend on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .kv import PRESETS, kv_bytes_per_token

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: Seed 000 §5.3.6: "the 8B GQA model of 5.1" (Llama 3 8B) stores 128 KB of KV per token in fp16,
#: computed by :func:`labsupport.kv.kv_bytes_per_token` (2 · 32 layers · 8 KV heads · 128 · 2 B).
SEED_KV_BYTES_PER_TOKEN = kv_bytes_per_token(PRESETS["Llama 3 8B"], "fp16")
#: Seed 000 §5.3.6: every request reserves the maximum context, 2048 tokens.
SEED_RESERVED_TOKENS = 2048
#: Seed 000 §5.3.6: requests actually end at 300 tokens (prompt + output) on average.
SEED_USED_TOKENS = 300
#: Seed 000 §5.3.6: "60 GB" of KV memory, in the seed's arithmetic 60,000 MB (see module doc).
SEED_KV_MEMORY_BYTES = 60_000 * MiB
#: Seed 000 §5.3.7: vLLM's default block size.
SEED_BLOCK_SIZE = 16
#: Seed 000 §5.3.4: batch size 8, four requests of 50 output tokens and four of 400.
SEED_BATCH_SIZE = 8
SEED_OUTPUT_LENS = (50, 50, 50, 50, 400, 400, 400, 400)


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _check_pos(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


# ----------------------------------------------------------------------------- reservation

def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Physical blocks a paged KV cache allocates for ``num_tokens`` tokens: ⌈tokens / block_size⌉.

    Raises:
        ValueError: ``num_tokens`` < 0 or ``block_size`` < 1.
    """
    _check_int("num_tokens", num_tokens, 0)
    _check_int("block_size", block_size, 1)
    return -(-num_tokens // block_size)


def requests_that_fit(memory_bytes: float, bytes_per_request: float) -> int:
    """How many requests of ``bytes_per_request`` fit in ``memory_bytes``: ⌊memory / per request⌋.

    Raises:
        ValueError: either argument is not > 0.
    """
    _check_pos("memory_bytes", memory_bytes)
    _check_pos("bytes_per_request", bytes_per_request)
    return int(memory_bytes // bytes_per_request)


@dataclass(frozen=True)
class ReservationReport:
    """One request under contiguous reservation and under paged allocation (bytes, tokens).

    Attributes:
        reserved_bytes: contiguous reservation, ``reserved_tokens × kv_bytes_per_token``.
        used_bytes: KV actually written, ``used_tokens × kv_bytes_per_token``.
        utilisation: ``used_bytes / reserved_bytes`` (seed: 37.5 / 256 ≈ 15 %).
        paged_blocks: blocks a paged cache allocates, ``⌈used_tokens / block_size⌉``.
        paged_bytes: ``paged_blocks × block_size × kv_bytes_per_token``.
        paged_waste_tokens: empty slots in the last block for this length.
        paged_waste_bound_tokens: worst case over all lengths, ``block_size − 1`` (seed: 15).
        requests_contiguous / requests_exact / requests_paged: how many such requests fit in
            ``memory_bytes`` (seed: 234 / ≈ 1,600 / ≥ 1,000).
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
        """KV the contiguous batch really uses: ``requests_contiguous × used_bytes`` (seed ≈ 8.8 GB)."""
        return self.requests_contiguous * self.used_bytes

    @property
    def capacity_gain(self) -> float:
        """``requests_exact / requests_contiguous`` (seed: ≈ 7×)."""
        return self.requests_exact / self.requests_contiguous if self.requests_contiguous else math.inf

    @property
    def paged_waste_bound_bytes(self) -> float:
        """``(block_size − 1) × kv_bytes_per_token`` (seed: 15 × 128 KB ≈ 1.9 MB)."""
        return self.paged_waste_bound_tokens * self.kv_bytes_per_token


def reservation_report(kv_bytes_per_token: float = SEED_KV_BYTES_PER_TOKEN,
                       reserved_tokens: int = SEED_RESERVED_TOKENS,
                       used_tokens: int = SEED_USED_TOKENS,
                       memory_bytes: float = SEED_KV_MEMORY_BYTES,
                       block_size: int = SEED_BLOCK_SIZE) -> ReservationReport:
    """Contiguous max-length reservation vs paged allocation for one typical request.

    Source: seed 000 §5.3.6 (2048 × 128 KB = 256 MB reserved vs 300 × 128 KB = 37.5 MB used,
    ≈ 15 %; 60 GB holds 234 requests vs ≈ 1,600) and §5.3.7 (block 16 wastes ≤ 15 tokens).

    Args:
        kv_bytes_per_token: KV bytes one token occupies (all layers, K and V).
        reserved_tokens: tokens reserved per request (the maximum context).
        used_tokens: tokens the request really holds when it finishes (prompt + output).
        memory_bytes: memory available for KV.
        block_size: tokens per block of the paged cache.

    Raises:
        ValueError: a size is not positive, or ``used_tokens > reserved_tokens``.
    """
    _check_pos("kv_bytes_per_token", kv_bytes_per_token)
    _check_int("reserved_tokens", reserved_tokens, 1)
    _check_int("used_tokens", used_tokens, 1)
    _check_pos("memory_bytes", memory_bytes)
    _check_int("block_size", block_size, 1)
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
        ValueError: empty ``lengths``, a length < 1, or ``block_size`` < 1.
    """
    if len(lengths) == 0:
        raise ValueError("lengths must hold at least one sequence length, got an empty sequence")
    allocated = sum(blocks_needed(_check_int("lengths[i]", int(n), 1), block_size) * block_size
                    for n in lengths)
    return (allocated - sum(int(n) for n in lengths)) / allocated


# ----------------------------------------------------------------------------- batching

@dataclass(frozen=True)
class BatchingReport:
    """Static batching in slot-steps, against ideal continuous batching (seed 000 §5.3.4).

    Attributes:
        useful_slot_steps: Σ output lengths — slot-steps that produced a token (seed: 1,800).
        occupied_slot_steps: ``batch_size × static_steps`` (seed: 8 × 400 = 3,200).
        utilisation: useful / occupied (seed: ≈ 56 %).
        static_steps: Σ over consecutive batches of the longest output in the batch (seed: 400).
        continuous_steps: ``useful / batch_size`` — every slot always busy (seed: 225).
        speedup: ``static_steps / continuous_steps = 1 / utilisation`` (seed: ≈ 1.78×).
    """

    batch_size: int
    useful_slot_steps: int
    occupied_slot_steps: int
    utilisation: float
    static_steps: int
    continuous_steps: float
    speedup: float


def batching_report(output_lens: Sequence[int] = SEED_OUTPUT_LENS,
                    batch_size: int = SEED_BATCH_SIZE) -> BatchingReport:
    """Slot-step utilisation of static batching and the ideal continuous-batching speed-up.

    Static batching takes the requests in order, ``batch_size`` at a time; each batch runs
    until its longest request ends (a decode step makes one token per live slot). Ideal
    continuous batching refills a slot the step it frees, so ``Σ lengths / batch_size``
    steps make the same tokens (the queue never runs dry; with a finite queue the last
    requests leave a tail — ``labsupport.sim.batching`` simulates that).

    Source: seed 000 §5.3.4 (batch 8, 4 × 50 + 4 × 400: 1,800 / 3,200 ≈ 56 %, 400 / 225 ≈ 1.78×).

    Raises:
        ValueError: empty ``output_lens``, a length < 1, or ``batch_size`` < 1.
    """
    _check_int("batch_size", batch_size, 1)
    if len(output_lens) == 0:
        raise ValueError("output_lens must hold at least one request, got an empty sequence")
    lens = [_check_int("output_lens[i]", int(n), 1) for n in output_lens]
    static_steps = sum(max(lens[i:i + batch_size]) for i in range(0, len(lens), batch_size))
    useful = sum(lens)
    occupied = batch_size * static_steps
    continuous = useful / batch_size
    return BatchingReport(batch_size=batch_size, useful_slot_steps=useful, occupied_slot_steps=occupied,
                          utilisation=useful / occupied, static_steps=static_steps,
                          continuous_steps=continuous, speedup=static_steps / continuous)


def bimodal_lengths(batch_size: int, short: int, long: int) -> list[int]:
    """Half the batch ``short`` tokens, half ``long`` (the seed's 4 × 50 + 4 × 400 for 8, 50, 400).

    Raises:
        ValueError: ``batch_size`` < 2 or not even, or a length < 1.
    """
    _check_int("batch_size", batch_size, 2)
    if batch_size % 2:
        raise ValueError(f"batch_size must be even, got {batch_size}")
    _check_int("short", short, 1)
    _check_int("long", long, 1)
    return [short] * (batch_size // 2) + [long] * (batch_size // 2)
