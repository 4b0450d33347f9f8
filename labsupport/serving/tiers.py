"""KV tiers under the prefix cache: GPU pool → CPU memory → disk (as LMCache does).

Without tiers, a prefix block the pool evicts (LRU) is gone: the next request with that
prefix recomputes it. With tiers the evicted block is **demoted** — its K/V copied to a CPU
tier, and when the CPU tier is full its least recently used entry goes on to a disk tier
(one safetensors file per block under a temporary folder); when the disk tier is full its
oldest entry is dropped. A request whose prefix is in a lower tier **promotes** it: the
blocks are read back into fresh pool blocks and registered, so the engine's ordinary prefix
match finds them. Tiers are exclusive: a block lives in one tier at a time.

A lower tier is storage the engine does not control (a file can be cut short, deleted or
overwritten), so each entry keeps a digest of its block's K/V (BLAKE2b) taken when it was
demoted; a promotion checks the shape, the dtype and the digest, and an entry that fails is a
cache miss: it is dropped, counted in :attr:`TieredKVCache.rejected`, and the prefix from that
block on is recomputed. Wrong K/V never reaches the pool.

A hit in a lower tier trades recomputation (FLOPs, ∝ tokens) for a copy (bytes, ∝ tokens · 2·L·H·D·bytes):
worth it when the copy beats the prefill it saves — on a GPU a CPU copy over PCIe usually does.

Hook: :attr:`BlockPool.on_evict <labsupport.engine.block_pool.BlockPool>` is called with the
block before its data is reused; :class:`TieredKVCache` sets it.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import tempfile
from collections import OrderedDict
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file
from typing_extensions import Self

from .. import kv as kvm
from ..sampling import GREEDY, SamplingParams
from ..validation import check_choice, check_int, check_real, check_type, renamed

__all__ = ["STORAGE_TIERS", "TIERS", "StorageTier", "TieredKVCache", "kv_digest", "run_chat", "tier_economics"]


@dataclass(frozen=True)
class StorageTier:
    """Where KV can live on a GPU server: ``capacity`` bytes, read into the GPU at ``bandwidth``
    bytes/s after ``latency_s`` seconds per read; ``holds_weights``: the model's weights share the
    capacity (the GPU's own memory)."""

    name: str
    capacity: float
    bandwidth: float
    latency_s: float
    holds_weights: bool = False

    def __post_init__(self):
        check_type("name", self.name, str)
        check_real("capacity", self.capacity, 0.0, low_open=True)
        check_real("bandwidth", self.bandwidth, 0.0, low_open=True)
        check_real("latency_s", self.latency_s, 0.0)
        check_type("holds_weights", self.holds_weights, bool)


#: The usual tiers of one H100 server (assumptions, stated in chapter 10): HBM (the prefix cache
#: itself), host DRAM over PCIe 5 x16, and a local NVMe drive (PCIe 4, sequential reads).
STORAGE_TIERS = (
    StorageTier("GPU HBM", 80e9, 3.35e12, 0.0, holds_weights=True),
    StorageTier("host DRAM (PCIe 5 x16)", 1e12, 64e9, 10e-6),
    StorageTier("NVMe SSD (PCIe 4)", 8e12, 7e9, 100e-6),
)


def tier_economics(shape: kvm.ModelShape, tier: StorageTier, prefix_tokens: int, acc: kvm.Accelerator = kvm.H100_SXM,
                   mfu: float = 0.5, kv_dtype: str = "fp16", weight_dtype: str = "bf16") -> dict:
    """Hit vs recompute for a cached prefix of ``prefix_tokens`` in ``tier``.

    Loading costs ``latency + P · KV bytes per token / bandwidth``; recomputing costs the prefill,
    ``P · 2N / (peak · mfu)`` (the linear part: attention's quadratic FLOPs only favour loading
    more). Both grow with P, so a tier pays at any length once its bandwidth exceeds
    ``crossover_bandwidth`` = KV bytes per token / recompute seconds per token, and below the
    ``crossover_tokens`` its latency alone decides.

    A tier carries its own capacity and bandwidth (``STORAGE_TIERS``' GPU tier is an H100's); ``acc`` sets the
    prefill's FLOP rate only.

    Returns:
        ``tokens`` the tier holds (a tier that ``holds_weights``: what the weights leave — 0 when they do not fit), ``load_s``, ``recompute_s``,
        ``speedup`` (recompute / load), ``crossover_bandwidth`` (bytes/s), ``crossover_tokens``
        (the prefix length from which loading wins; ``inf`` if it never does).

    Raises:
        TypeError / ValueError: ``prefix_tokens`` < 1, ``mfu`` outside (0, 1].
    """
    check_type("shape", shape, kvm.ModelShape)
    check_type("tier", tier, StorageTier)
    check_type("acc", acc, kvm.Accelerator)
    p = check_int("prefix_tokens", prefix_tokens, 1)
    mfu = check_real("mfu", mfu, 0.0, 1.0, low_open=True)
    check_choice("weight_dtype", weight_dtype, kvm.DTYPE_BITS)
    per_token = kvm.kv_bytes_per_token(shape, kv_dtype)
    room = tier.capacity - (kvm.weight_bytes(shape, weight_dtype) if tier.holds_weights else 0)
    recompute_per_token = kvm.prefill_time(1, shape.n_params, acc) / mfu
    load_per_token = per_token / tier.bandwidth
    load_s = tier.latency_s + p * load_per_token
    recompute_s = p * recompute_per_token
    gain = recompute_per_token - load_per_token
    return {"tokens": max(0, int(room // per_token)), "load_s": load_s, "recompute_s": recompute_s,
            "speedup": recompute_s / load_s, "crossover_bandwidth": per_token / recompute_per_token,
            "crossover_tokens": math.ceil(tier.latency_s / gain) if gain > 0 else math.inf}

TIERS = ("pool", "cpu", "disk")


@dataclass
class _Entry:
    key: int
    parent: int | None
    token_ids: list[int]
    kv: torch.Tensor | None = None        # CPU tier: (num_layers, 2, block_size, num_heads, head_dim)
    path: str | None = None               # disk tier: its safetensors file
    digest: str = ""                      # BLAKE2b of the K/V bytes when demoted: checked on promotion


def kv_digest(kv: torch.Tensor) -> str:
    """A block's K/V fingerprint: BLAKE2b (128 bits) of its bytes, its shape and its dtype."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{tuple(kv.shape)}{kv.dtype}".encode())
    h.update(kv.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _remove(path: str | None) -> None:
    """Delete a tier file; one already gone (deleted by someone else) is no error."""
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


class TieredKVCache:
    """A CPU tier and a disk tier below an engine's prefix cache, each with LRU eviction.

    Args:
        engine: an :class:`~labsupport.engine.LLMEngine` with ``enable_prefix_caching=True``.
        cpu_capacity: blocks the CPU tier holds (0 = no CPU tier: demote straight to disk).
        disk_capacity: blocks the disk tier holds (0 = no disk tier: drop).
        disk_dir: folder for the disk tier; default a new temporary folder, removed by :meth:`close`.

    Use :meth:`add_request` instead of ``engine.add_request`` so a prompt's lower-tier blocks
    are promoted first. Counters: :attr:`demoted`, :attr:`promoted` (per tier), :attr:`dropped`,
    :attr:`rejected` (per tier: entries whose file was missing or unreadable, or whose K/V had the
    wrong shape or dtype or no longer matched its digest; each a miss), :attr:`rejections` (why).

    Raises:
        TypeError / ValueError: capacities not integers ≥ 0, or prefix caching off.
    """

    def __init__(self, engine, cpu_capacity: int = 64, disk_capacity: int = 256, disk_dir: str | None = None):
        if not engine.config.enable_prefix_caching:
            raise ValueError("engine must have enable_prefix_caching=True for KV tiers")
        if engine.runner.quantized_kv:
            raise ValueError(f"KV tiers copy blocks as the cache stores them: the engine needs kv_cache_dtype='auto', "
                             f"got {engine.runner.kv_cache_dtype!r}")
        self.cpu_capacity = check_int("cpu_capacity", cpu_capacity, 0)
        self.disk_capacity = check_int("disk_capacity", disk_capacity, 0)
        self.engine, self.runner = engine, engine.runner
        self.pool = engine.block_manager.pool
        self.block_size = engine.block_manager.block_size
        self._tmp = tempfile.TemporaryDirectory(prefix="kv-tier-") if disk_dir is None else None
        self.disk_dir = self._tmp.name if self._tmp is not None else str(disk_dir)
        os.makedirs(self.disk_dir, exist_ok=True)
        self.cpu: OrderedDict[int, _Entry] = OrderedDict()     # least recently used first
        self.disk: OrderedDict[int, _Entry] = OrderedDict()
        self.demoted = {"cpu": 0, "disk": 0}
        self.promoted = {"cpu": 0, "disk": 0}
        self.dropped = 0
        self.rejected = {"cpu": 0, "disk": 0}
        self.rejections: list[str] = []
        self._dropped_keys: set[int] = set()
        self._seen: set[int] = set()                           # every key ever demoted (for audit)
        self.records: list[dict] = []                          # per request: blocks served by each tier, TTFT
        self.pool.on_evict = self._demote

    # ------------------------------------------------------------------ demotion
    def _demote(self, block) -> None:
        """Called by the pool before an evictable block is reused: keep a copy in the CPU tier."""
        if block.hash is None or len(block.token_ids) != self.block_size:
            return
        kv = self.runner.kv_cache[:, :, block.block_id].detach().to("cpu", copy=True)
        self._seen.add(block.hash)
        self._dropped_keys.discard(block.hash)
        self._put_cpu(_Entry(block.hash, block.parent_hash, list(block.token_ids), kv, digest=kv_digest(kv)))

    def _put_cpu(self, entry: _Entry) -> None:
        if self.cpu_capacity == 0:
            self._put_disk(entry)
            return
        self._forget(entry.key)
        self.cpu[entry.key] = entry
        self.demoted["cpu"] += 1
        while len(self.cpu) > self.cpu_capacity:
            _, old = self.cpu.popitem(last=False)
            self._put_disk(old)

    def _put_disk(self, entry: _Entry) -> None:
        if self.disk_capacity == 0:
            self._drop(entry)
            return
        self._forget(entry.key)
        entry.path = os.path.join(self.disk_dir, f"{entry.key & (2 ** 64 - 1):016x}.safetensors")
        save_file({"kv": entry.kv.contiguous()}, entry.path, metadata={"blake2b": entry.digest})
        entry.kv = None
        self.disk[entry.key] = entry
        self.demoted["disk"] += 1
        while len(self.disk) > self.disk_capacity:
            _, old = self.disk.popitem(last=False)
            _remove(old.path)
            self._drop(old)

    def _drop(self, entry: _Entry) -> None:
        self.dropped += 1
        self._dropped_keys.add(entry.key)

    def _forget(self, key: int) -> None:
        """Remove a key from the lower tiers (a newer copy replaces it)."""
        if key in self.cpu:
            del self.cpu[key]
        if key in self.disk:
            _remove(self.disk.pop(key).path)

    # ------------------------------------------------------------------ promotion
    @torch.inference_mode()
    def promote(self, token_ids: list[int]) -> dict[str, int]:
        """Bring the prompt's cached prefix blocks from the lower tiers back into the pool.

        Walks the prompt's full blocks (all but the last token, like the engine's prefix match)
        as long as each is in the pool or a lower tier; promoted blocks are written into fresh
        pool blocks and registered. Blocks on the way are held while promoting so none is
        evicted by the promotion itself.

        Returns:
            ``{"pool": n, "cpu": n, "disk": n, "miss": n}``: full blocks served by each tier, and
            those none of them had.
        """
        bs, pool = self.block_size, self.pool
        counts = dict.fromkeys((*TIERS, "miss"), 0)
        num_full = (len(token_ids) - 1) // bs
        held, parent = [], None
        for i in range(num_full):
            toks = [int(t) for t in token_ids[i * bs:(i + 1) * bs]]
            hit = pool.lookup(parent, toks)
            if hit is not None:
                pool.acquire(hit[1])
                held.append(hit[1])
                counts["pool"] += 1
                parent = hit[0]
                continue
            key = pool.hash_fn(parent, toks)
            tier = "cpu" if key in self.cpu else "disk" if key in self.disk else None
            entry = self.cpu.get(key) or self.disk.get(key)
            if tier is None or entry.token_ids != toks or entry.parent != parent or pool.num_available_blocks == 0:
                break
            # out of its tier first: taking a pool block may demote another one into the CPU tier,
            # which could push this very entry down to disk (or drop it) mid-promotion
            kv = self._take_out(tier, key)
            if kv is None:                                     # unreadable or not what was stored: a miss
                break
            block = pool.take()                                # may demote another block
            self.runner.kv_cache[:, :, block.block_id] = kv.to(self.runner.device)
            block.token_ids = toks
            pool.register(block, key, parent)
            self.promoted[tier] += 1
            counts[tier] += 1
            held.append(block.block_id)
            parent = key
        counts["miss"] = num_full - sum(counts[t] for t in TIERS)
        for block_id in reversed(held):                        # the head ends most recently used
            pool.release(block_id)
        return counts

    def _take_out(self, tier: str, key: int) -> torch.Tensor | None:
        """Remove ``key``'s entry from ``tier``; its K/V if they are exactly what was demoted, else
        ``None`` (the entry counted in :attr:`rejected`, the reason in :attr:`rejections`)."""
        entry = (self.cpu if tier == "cpu" else self.disk).pop(key)
        kv, why = entry.kv, None
        if tier == "disk":
            try:
                kv = load_file(entry.path).get("kv")
            except Exception as err:                           # noqa: BLE001 - any unreadable file is a miss
                kv, why = None, f"unreadable ({type(err).__name__}: {err})"
            _remove(entry.path)
        one = self.runner.cache_shape(1)                     # (L, 2, 1, bs, H, D): one block's K/V is (L, 2, bs, H, D)
        shape = one[:2] + one[3:]
        if why is None and not isinstance(kv, torch.Tensor):
            why = "no K/V tensor in it"
        elif why is None and (tuple(kv.shape) != shape or kv.dtype != self.runner.kv_cache.dtype):
            why = f"K/V of shape {tuple(kv.shape)} and {kv.dtype}, expected {shape} and {self.runner.kv_cache.dtype}"
        elif why is None and kv_digest(kv) != entry.digest:
            why = "K/V no longer match the digest taken when it was demoted"
        if why is None:
            return kv
        self.rejected[tier] += 1
        self.rejections.append(f"{tier} tier block {key & (2 ** 64 - 1):016x}: {why}")
        self._dropped_keys.add(key)                            # accounted for (audit): gone, never served
        return None

    def add_request(self, prompt: list[int], params: SamplingParams = GREEDY, max_tokens: int | None = None,
                    request_id: str | None = None, *, max_new_tokens: int | None = None) -> str:
        """Promote the prompt's lower-tier blocks, then ``engine.add_request`` (the promotion time counts
        in the TTFT: the arrival is taken before). ``max_new_tokens``: deprecated name of ``max_tokens``."""
        max_tokens = renamed("max_tokens", max_tokens, "max_new_tokens", max_new_tokens)
        arrival = self.engine.config.clock()
        counts = self.promote(list(prompt))
        rid = self.engine.add_request(prompt, params, max_tokens, request_id, arrival_time=arrival)
        self.records.append({"request_id": rid, **counts})
        return rid

    @staticmethod
    def served_by(counts: dict[str, int]) -> str:
        """The slowest tier a request needed: ``"disk"``, ``"cpu"``, ``"pool"``, or ``"miss"`` (no hit)."""
        for tier in ("disk", "cpu", "pool"):
            if counts[tier]:
                return tier
        return "miss"

    # ------------------------------------------------------------------ checks and cleanup
    def audit(self) -> None:
        """Check every tier: the pool's own audit, capacities, one file per disk entry and no
        stray file, no block in two lower tiers, and every block ever demoted accounted for
        (in the pool's index, the CPU tier, the disk tier, or counted as dropped).

        Raises:
            RuntimeError: describing the first inconsistency.
        """
        self.engine.block_manager.audit()
        if len(self.cpu) > self.cpu_capacity or len(self.disk) > self.disk_capacity:
            raise RuntimeError(f"tier over capacity: cpu {len(self.cpu)}/{self.cpu_capacity}, "
                               f"disk {len(self.disk)}/{self.disk_capacity}")
        if set(self.cpu) & set(self.disk):
            raise RuntimeError("a block is in both the CPU and the disk tier")
        files = {os.path.join(self.disk_dir, f) for f in os.listdir(self.disk_dir) if f.endswith(".safetensors")}
        if files != {e.path for e in self.disk.values()}:
            raise RuntimeError(f"disk tier: {len(files)} files for {len(self.disk)} entries")
        if any(e.kv is None for e in self.cpu.values()) or any(e.kv is not None for e in self.disk.values()):
            raise RuntimeError("a CPU entry without data, or a disk entry holding data in memory")
        for key in self._seen:
            places = self.pool.is_registered(key) + (key in self.cpu) + (key in self.disk) + (key in self._dropped_keys)
            if places < 1:
                raise RuntimeError(f"block {key:#x} was demoted and is now nowhere (lost)")

    def close(self) -> None:
        """Detach from the pool and delete the disk tier's files (and its temporary folder)."""
        if self.pool.on_evict == self._demote:
            self.pool.on_evict = None
        for entry in self.disk.values():
            _remove(entry.path)
        self.disk.clear()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_chat(engine, tiers: TieredKVCache | None, conversations: list[list[list[int]]], system: list[int],
             new_tokens: int = 8) -> list[dict]:
    """A multi-turn chat workload, one request at a time, turns of the conversations interleaved
    (turn 1 of every conversation, then turn 2, …): each prompt is the system prompt, the
    conversation so far (earlier questions and the model's answers) and the new question.

    Returns:
        one record per request: ``request_id``, ``ttft`` (s), ``computed`` (prompt tokens run
        through the model), and with tiers the full blocks each tier served and ``served_by``.
    """
    history = [list(system) for _ in conversations]
    out = []
    for turn in range(max(len(c) for c in conversations)):
        for c, conv in enumerate(conversations):
            if turn >= len(conv):
                continue
            prompt = history[c] + list(conv[turn])
            before = engine.runner.num_token_forwards
            if tiers is not None:
                rid = tiers.add_request(prompt, GREEDY, new_tokens)
                record = dict(tiers.records[-1])
            else:
                rid = engine.add_request(prompt, GREEDY, new_tokens, arrival_time=engine.config.clock())
                record = {"request_id": rid}
            result = engine.run()[-1]
            record.update(ttft=result.metrics.ttft, prompt_tokens=len(prompt),
                          computed=len(prompt) - engine.requests[rid].num_prefix_hit_tokens,
                          forwarded=engine.runner.num_token_forwards - before)
            if tiers is not None:
                record["served_by"] = tiers.served_by(record)
            out.append(record)
            history[c] = prompt + list(result.token_ids)
    return out
