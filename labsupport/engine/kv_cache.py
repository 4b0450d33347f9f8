"""The paged KV cache's tensors and every move of their blocks: copy-on-write copies, swap to and
from CPU memory, whole sequences read and written (KV transfer, KV tiers), slots moved (tree
verification).

The cache is one tensor ``(num_layers, 2, num_blocks, block_size, num_heads, head_dim)`` (with an
8-bit ``kv_cache_dtype`` it holds codes, and ``kv_scales`` ``(…, num_heads)`` their fp16 scales:
:mod:`labsupport.quant.kv`); the CPU swap space has the same shape with ``num_cpu_blocks`` blocks and
is allocated on first use. :class:`PagedKVCache` is the part of :class:`~labsupport.engine.ModelRunner`
that owns them; it never decides which blocks a sequence uses (that is the block manager's job).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from ..kv import blocks_needed
from ..quant import kv as kvq
from ..validation import is_int
from .block_manager import slot_mapping_of

__all__ = ["PagedKVCache"]


class PagedKVCache:
    """Block moves over ``kv_cache`` / ``kv_scales`` (device) and ``cpu_cache`` / ``cpu_scales`` (swap).

    The runner sets ``num_layers``, ``num_heads``, ``head_dim``, ``block_size``, ``num_blocks``,
    ``num_cpu_blocks``, ``device``, ``dtype``, ``kv_cache_dtype`` and the four tensors.
    """

    num_layers: int
    num_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    num_cpu_blocks: int
    device: torch.device
    dtype: torch.dtype
    kv_cache_dtype: str
    kv_cache: torch.Tensor
    kv_scales: torch.Tensor | None
    cpu_cache: torch.Tensor | None
    cpu_scales: torch.Tensor | None

    def cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """``(num_layers, 2, num_blocks, block_size, num_heads, head_dim)``."""
        return (self.num_layers, 2, num_blocks, self.block_size, self.num_heads, self.head_dim)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token takes over all layers: ``2 · L · H · D · bytes`` (8-bit KV:
        ``2 · L · H · (D + 2)``, the fp16 scale of each head included)."""
        return kvq.kv_bytes_per_token(self.num_layers, self.num_heads, self.head_dim, self.kv_cache_dtype,
                                      model_bytes=self.kv_cache.element_size())

    @property
    def quantized_kv(self) -> bool:
        return self.kv_scales is not None

    def _stores(self, cpu: bool = False) -> tuple[torch.Tensor, ...]:
        """The tensors a block move applies to: the cache, and its scales for 8-bit KV (``cpu``: the swap space's)."""
        if cpu:
            return (self.cpu_cache,) if self.kv_scales is None else (self.cpu_cache, self.cpu_scales)
        return (self.kv_cache,) if self.kv_scales is None else (self.kv_cache, self.kv_scales)

    # ------------------------------------------------------------------ moving blocks
    @staticmethod
    def _check_blocks(name: str, ids: Sequence[int], num_blocks: int) -> None:
        if all(type(b) is int and 0 <= b < num_blocks for b in ids):     # the common case, without is_int's isinstance
            return
        bad = [b for b in ids if not (is_int(b) and 0 <= b < num_blocks)]
        if bad:
            raise ValueError(f"{name} must hold block ids in [0, {num_blocks}), got {bad[0]!r}")

    def _check_pairs(self, name: str, pairs: list[tuple[int, int]], src_blocks: int, dst_blocks: int) -> None:
        self._check_blocks(f"{name} (source blocks)", [p[0] for p in pairs], src_blocks)
        self._check_blocks(f"{name} (destination blocks)", [p[1] for p in pairs], dst_blocks)

    def copy_blocks(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Copy-on-write: copy whole blocks ``src → dst`` in every layer's K and V.

        Raises:
            ValueError: a block id outside the pool.
        """
        pairs = list(pairs)
        if not pairs:                         # most steps copy nothing: return before entering inference mode
            return
        self._check_pairs("pairs", pairs, self.num_blocks, self.num_blocks)
        with torch.inference_mode():
            src = torch.tensor([s for s, _ in pairs], device=self.device)
            dst = torch.tensor([d for _, d in pairs], device=self.device)
            for t in self._stores():
                t[:, :, dst] = t[:, :, src]

    def swap_out(self, mapping: Mapping[int, int] | Iterable[tuple[int, int]]) -> None:
        """Copy device blocks to CPU swap blocks (``{device_block: cpu_block}`` or a list of such pairs).

        Raises:
            ValueError: a block id outside the device pool or the CPU swap space.
        """
        pairs = list(mapping.items() if isinstance(mapping, Mapping) else mapping)
        if not pairs:
            return
        self._check_pairs("mapping", pairs, self.num_blocks, self.num_cpu_blocks)
        with torch.inference_mode():          # entered only when there is something to move
            if self.cpu_cache is None:
                self.cpu_cache = torch.zeros(self.cache_shape(self.num_cpu_blocks), dtype=self.kv_cache.dtype)
                if self.kv_scales is not None:
                    self.cpu_scales = torch.ones(self.cache_shape(self.num_cpu_blocks)[:-1], dtype=torch.float16)
            src = torch.tensor([s for s, _ in pairs], device=self.device)
            dst = torch.tensor([d for _, d in pairs])
            for host, dev in zip(self._stores(cpu=True), self._stores()):
                host[:, :, dst] = dev[:, :, src].cpu()

    def swap_in(self, mapping: Mapping[int, int]) -> None:
        """Copy CPU swap blocks back to device blocks (``{cpu_block: device_block}``).

        Raises:
            ValueError: a block id outside the pools, or nothing swapped out yet.
        """
        if not mapping:
            return
        self._check_pairs("mapping", list(mapping.items()), self.num_cpu_blocks, self.num_blocks)
        if self.cpu_cache is None:
            raise ValueError("mapping names CPU blocks, but nothing was swapped out yet (the CPU cache is empty)")
        with torch.inference_mode():          # entered only when there is something to move
            src = torch.tensor(list(mapping.keys()))
            dst = torch.tensor(list(mapping.values()), device=self.device)
            for dev, host in zip(self._stores(), self._stores(cpu=True)):
                dev[:, :, dst] = host[:, :, src].to(self.device)

    # ------------------------------------------------------------------ KV of whole sequences (KV transfer)
    def _slots(self, block_table: Sequence[int], start: int, num_tokens: int) -> torch.Tensor:
        if num_tokens and (start < 0 or blocks_needed(start + num_tokens, self.block_size) > len(block_table)):
            raise ValueError(f"block table of {len(block_table)} blocks holds no slots for positions "
                             f"{start}..{start + num_tokens - 1}")
        slots = slot_mapping_of(list(block_table), range(start, start + num_tokens), self.block_size)
        return torch.tensor(slots, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def read_kv(self, block_table: Sequence[int], num_tokens: int, start: int = 0) -> torch.Tensor:
        """K and V of positions ``start … start+num_tokens-1`` of a sequence, every layer, gathered
        from its blocks: ``(num_layers, 2, num_tokens, num_heads, head_dim)`` (a copy).

        Raises:
            ValueError: the block table has no slot for one of the positions.
        """
        slots = self._slots(block_table, start, num_tokens)
        flat = self.kv_cache.flatten(2, 3)                                   # (L, 2, NB·bs, H, D)
        if self.kv_scales is None:
            return flat.index_select(2, slots).clone()
        scales = self.kv_scales.flatten(2, 3).index_select(2, slots)
        return kvq.dequantize_kv(flat.index_select(2, slots), scales, self.kv_cache_dtype)   # float32

    @torch.inference_mode()
    def write_kv(self, block_table: Sequence[int], kv: torch.Tensor, start: int = 0) -> None:
        """Write ``kv`` ``(num_layers, 2, n, num_heads, head_dim)`` into the slots of positions
        ``start … start+n-1`` of a sequence (KV received from another engine or a lower tier).

        Raises:
            ValueError: a tensor of another shape, or a block table too short.
        """
        expected = (self.num_layers, 2, self.num_heads, self.head_dim)
        if kv.dim() != 5 or (kv.shape[0], kv.shape[1], kv.shape[3], kv.shape[4]) != expected:
            raise ValueError(f"kv must have shape (num_layers, 2, n, num_heads, head_dim) = "
                             f"({expected[0]}, 2, n, {expected[2]}, {expected[3]}), got {tuple(kv.shape)}")
        slots = self._slots(block_table, start, kv.shape[2])
        if self.kv_scales is None:
            self.kv_cache.flatten(2, 3).index_copy_(2, slots, kv.to(self.device, self.dtype))
            return
        codes, scales = kvq.quantize_kv(kv.to(self.device), self.kv_cache_dtype)
        self.kv_cache.flatten(2, 3).index_copy_(2, slots, codes)
        self.kv_scales.flatten(2, 3).index_copy_(2, slots, scales)

    def move_slots(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Copy the K/V (and scales) of flat slots ``src`` to slots ``dst`` in every layer (tree
        verification keeps the accepted path's entries this way)."""
        src_t = torch.tensor(list(src), dtype=torch.long, device=self.device)
        dst_t = torch.tensor(list(dst), dtype=torch.long, device=self.device)
        for t in self._stores():
            flat = t.flatten(2, 3)
            flat[:, :, dst_t] = flat[:, :, src_t]
