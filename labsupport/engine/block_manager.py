"""The block manager: block tables of a paged KV cache (PagedAttention, Kwon et al., 2023).

The KV cache is cut into ``num_blocks`` physical *blocks* of ``block_size`` token *slots*
each. A sequence does not own one contiguous region; it owns a *block table*, a list that
maps its logical block ``i`` (tokens ``i·bs … i·bs+bs-1``) to a physical block anywhere in
the pool. A token at position ``p`` lives in slot::

    slot = block_table[p // block_size] * block_size + p % block_size      (the slot mapping)

so a sequence wastes at most ``block_size - 1`` slots, in its last block.

Blocks are *ref-counted* by the :class:`~labsupport.engine.block_pool.BlockPool`. ``fork``
gives a child the parent's block table (every ref count +1); the first write into a shared
block copies it first (*copy-on-write*). With *prefix caching* a prompt that starts with
registered full blocks reuses them instead of recomputing (see the pool's docstring).

This module is pure Python bookkeeping: no tensors. The KV tensors live in the model runner's
cache ``(num_layers, 2, num_blocks, block_size, num_heads, head_dim)``; the calls that move
data (copy-on-write, swap) return the block pairs the runner must copy.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Hashable, Iterable, Sequence

from ..kv import blocks_needed
from ..validation import check_bool, check_int, check_token_ids
from .block_pool import Block, BlockPool, NoFreeBlocksError, block_hash
from .swap_space import BlockSwapping, SwapSpace

__all__ = ["Block", "BlockManager", "BlockPool", "NoFreeBlocksError", "block_hash", "slot_mapping_of"]

SeqId = Hashable
Slot = tuple[int, int, "int | None"]          # (physical block, offset in it, copied_from or None)


def slot_mapping_of(block_table: Sequence[int], positions: Iterable[int], block_size: int) -> list[int]:
    """The slot mapping, in one place: the flat cache slot of each position,
    ``block_table[p // block_size] * block_size + p % block_size``. Unchecked (the callers check
    their positions against the table first); the block manager, the attention metadata and the
    runner's whole-sequence KV moves all call it."""
    return [block_table[p // block_size] * block_size + p % block_size for p in positions]


class BlockManager(BlockSwapping):
    """A pool of KV blocks with per-sequence block tables, ref counts, copy-on-write,
    prefix caching (LRU eviction) and swap space.

    Args:
        num_blocks: physical blocks in the (GPU) pool, ≥ 1.
        block_size: token slots per block, ≥ 1.
        enable_prefix_caching: register full, computed blocks and reuse them across prompts.
        num_cpu_blocks: blocks of CPU swap space (for preemption by swap), ≥ 0.
        hash_fn: ``(parent_hash, token_ids) -> int``; replaceable so a test can force collisions.

    Raises:
        TypeError: a size that is not an integer, a flag that is not a bool.
        ValueError: a size outside its range.

    The usual life of a sequence: ``allocate(seq, prompt)`` → the runner computes the prompt →
    ``mark_computed(seq, n)`` → per decode step ``append_slot(seq, token)`` → … → ``free(seq)``.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 num_cpu_blocks: int = 0, hash_fn: Callable[[int | None, Sequence[int]], int] = block_hash):
        self.pool = BlockPool(num_blocks, hash_fn)
        self.num_blocks = self.pool.num_blocks
        self.blocks = self.pool.blocks
        self.block_size = check_int("block_size", block_size, 1)
        self.enable_prefix_caching = check_bool("enable_prefix_caching", enable_prefix_caching)
        self.num_cpu_blocks = num_cpu_blocks = check_int("num_cpu_blocks", num_cpu_blocks, 0)
        self.swap_space = SwapSpace(num_cpu_blocks)
        self._tables: dict[SeqId, list[int]] = {}                   # seq -> physical block ids
        self._num_slots: dict[SeqId, int] = {}                     # seq -> tokens with a slot
        self._chain: dict[SeqId, list[int]] = {}                    # seq -> hashes of its computed full blocks
        self._swapped: set[SeqId] = set()                           # seqs whose table is in CPU blocks
        self.num_prefix_hit_blocks = 0                              # blocks reused from the cache (total)

    # ------------------------------------------------------------------ pool state
    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0 that hold no registered prefix."""
        return self.pool.num_free_blocks

    @property
    def num_evictable_blocks(self) -> int:
        """Blocks with ref count 0 that still hold a registered prefix (reusable on a hit, evicted LRU)."""
        return self.pool.num_evictable_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks with ref count ≥ 1."""
        return self.pool.num_used_blocks

    @property
    def num_available_blocks(self) -> int:
        """Blocks an allocation may take: free + evictable."""
        return self.pool.num_available_blocks

    @property
    def num_evictions(self) -> int:
        """Registered blocks evicted so far to make room."""
        return self.pool.num_evictions

    @property
    def num_free_cpu_blocks(self) -> int:
        return self.swap_space.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        """``ceil(num_tokens / block_size)``: blocks that hold ``num_tokens`` slots."""
        return blocks_needed(num_tokens, self.block_size)

    # ------------------------------------------------------------------ sequences
    def has_seq(self, seq_id: SeqId) -> bool:
        return seq_id in self._tables

    def is_swapped(self, seq_id: SeqId) -> bool:
        return seq_id in self._swapped

    def block_table(self, seq_id: SeqId) -> list[int]:
        """The sequence's physical block ids, logical block 0 first (a copy)."""
        return list(self._table(seq_id))

    def block_tables(self) -> dict[SeqId, list[int]]:
        """Every resident (not swapped) sequence's block table."""
        return {s: list(t) for s, t in self._tables.items() if s not in self._swapped}

    def num_slots(self, seq_id: SeqId) -> int:
        """Tokens of the sequence that have a slot."""
        self._table(seq_id)
        return self._num_slots[seq_id]

    def ref_count(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count

    def ref_counts(self) -> list[int]:
        """Ref count of every physical block, by block id."""
        return [b.ref_count for b in self.blocks]

    def slot_mapping(self, seq_id: SeqId, positions: Sequence[int]) -> list[int]:
        """Flat slot index of each position: ``block_table[p // bs] * bs + p % bs``.

        Raises:
            ValueError: a position the sequence has no slot for.
        """
        table, n = self._table(seq_id), self._num_slots[seq_id]
        bad = next((p for p in positions if not 0 <= p < n), None)
        if bad is not None:
            raise ValueError(f"positions must be in [0, {n}) for sequence {seq_id!r}, got {bad}")
        return slot_mapping_of(table, positions, self.block_size)

    def _table(self, seq_id: SeqId) -> list[int]:
        try:
            return self._tables[seq_id]
        except KeyError:
            raise ValueError(f"seq_id {seq_id!r} has no blocks (never allocated or already freed)") from None

    # ------------------------------------------------------------------ prefix cache
    def _match_prefix(self, token_ids: Sequence[int]) -> list[tuple[int, int]]:
        """``(key, block_id)`` of the registered full blocks this prompt starts with (none when
        prefix caching is off); see :meth:`BlockPool.match_prefix`."""
        return self.pool.match_prefix(token_ids, self.block_size) if self.enable_prefix_caching else []

    def num_prefix_hit_tokens(self, token_ids: Sequence[int]) -> int:
        """Tokens of ``token_ids`` a prefix-cache hit would skip (multiple of ``block_size``)."""
        return len(self._match_prefix(token_ids)) * self.block_size

    def mark_computed(self, seq_id: SeqId, num_computed_tokens: int) -> None:
        """Tell the manager the KV of the first ``num_computed_tokens`` tokens is written.

        With prefix caching, every full block inside that range is registered under its chain
        hash (unless an identical block is already registered). Registering only computed
        blocks means a hit never reads KV that has not been written yet. No-op otherwise.
        """
        if not self.enable_prefix_caching or seq_id in self._swapped:
            return
        full = min(int(num_computed_tokens), self._num_slots[seq_id]) // self.block_size
        self.pool.register_full_blocks(self._table(seq_id), self._chain[seq_id], full, self.block_size)

    # ------------------------------------------------------------------ allocation
    def can_allocate(self, tokens: int | Sequence[int]) -> bool:
        """Whether a new sequence of ``tokens`` (a count, or the ids to use prefix hits) fits now.

        A prefix hit on a block another sequence holds costs nothing; a hit on a cached
        block takes it out of the evictable set, like a new block.
        """
        if isinstance(tokens, numbers.Integral):
            return self.blocks_needed(tokens) <= self.num_available_blocks
        hits = self._match_prefix(tokens)
        shared = sum(1 for _, b in hits if self.blocks[b].ref_count > 0)
        return self.blocks_needed(len(tokens)) - shared <= self.num_available_blocks

    def allocate(self, seq_id: SeqId, token_ids: Sequence[int]) -> int:
        """Give a new sequence slots for ``token_ids`` (its prompt, or prompt + output on recompute).

        Returns:
            tokens whose KV is already in the cache (prefix hits; a multiple of ``block_size``,
            always < ``len(token_ids)``); the caller computes only the rest.

        Raises:
            ValueError: ``seq_id`` already has blocks, or ``token_ids`` is empty.
            NoFreeBlocksError: not enough blocks (check :meth:`can_allocate` first); nothing changes.
        """
        if seq_id in self._tables:
            raise ValueError(f"seq_id {seq_id!r} already has blocks; free it or use another id")
        if len(token_ids) == 0:
            raise ValueError("token_ids must hold at least one token, got none")
        token_ids = check_token_ids("token_ids", token_ids, 2 ** 63)     # before any block is taken
        if not self.can_allocate(token_ids):
            raise NoFreeBlocksError(f"sequence {seq_id!r} needs {self.blocks_needed(len(token_ids))} blocks, "
                                    f"{self.num_available_blocks} available")
        hits = self._match_prefix(token_ids)
        table: list[int] = []
        for _, block_id in hits:                                # take the hits before evicting anything
            self.pool.acquire(block_id)
            table.append(block_id)
        self.num_prefix_hit_blocks += len(hits)
        bs = self.block_size
        for i in range(len(hits), self.blocks_needed(len(token_ids))):
            block = self.pool.take()
            block.token_ids = [int(t) for t in token_ids[i * bs:(i + 1) * bs]]
            table.append(block.block_id)
        self._tables[seq_id] = table
        self._num_slots[seq_id] = len(token_ids)
        self._chain[seq_id] = [h for h, _ in hits]
        return len(hits) * bs

    def can_append(self, seq_id: SeqId, num_tokens: int = 1) -> bool:
        """Whether ``num_tokens`` more slots (with a copy-on-write if the last block is shared) fit now."""
        return self._blocks_to_append(seq_id, num_tokens) <= self.num_available_blocks

    def _blocks_to_append(self, seq_id: SeqId, num_tokens: int) -> int:
        table, n, bs = self._table(seq_id), self._num_slots[seq_id], self.block_size
        new = self.blocks_needed(n + num_tokens) - len(table)
        if n % bs and self.blocks[table[-1]].ref_count > 1 and num_tokens > 0:
            new += 1                                            # copy of the shared last block
        return new

    def append_slot(self, seq_id: SeqId, token_id: int) -> Slot:
        """Give the sequence's next token a slot.

        Returns:
            ``(physical_block, offset, copied_from)``: the slot is ``physical_block·bs + offset``;
            ``copied_from`` is the shared block whose contents the runner must copy into
            ``physical_block`` first (copy-on-write), else ``None``.

        Raises:
            ValueError: unknown or swapped-out sequence.
            NoFreeBlocksError: a new block is needed and none is available (check :meth:`can_append`).
        """
        if seq_id in self._swapped:
            raise ValueError(f"sequence {seq_id!r} is swapped out; swap_in first")
        table, n, bs = self._table(seq_id), self._num_slots[seq_id], self.block_size
        offset, copied_from = n % bs, None
        if offset == 0:                                         # last block full (or none yet)
            table.append(self.pool.take().block_id)
        elif self.blocks[table[-1]].ref_count > 1:              # shared: copy before the first write
            old = self.blocks[table[-1]]
            new = self.pool.take()
            new.token_ids = old.token_ids[:offset]
            old.ref_count -= 1                                  # still ≥ 1: the others keep it
            copied_from, table[-1] = old.block_id, new.block_id
        block = self.blocks[table[-1]]
        if block.hash is not None:                              # content changes: no longer a valid cache entry
            self.pool.unregister(block)
        del block.token_ids[offset:]
        block.token_ids.append(int(token_id))
        self._num_slots[seq_id] = n + 1
        return table[-1], offset, copied_from

    def append_slots(self, seq_id: SeqId, token_ids: Sequence[int]) -> list[Slot]:
        """:meth:`append_slot` for several tokens (e.g. γ draft tokens to verify); all-or-nothing.

        Raises:
            NoFreeBlocksError: not enough blocks for all of them; nothing changes.
        """
        token_ids = check_token_ids("token_ids", token_ids, 2 ** 63, allow_empty=True)   # before any slot
        if not self.can_append(seq_id, len(token_ids)):
            raise NoFreeBlocksError(f"sequence {seq_id!r} needs {self._blocks_to_append(seq_id, len(token_ids))} "
                                    f"blocks, {self.num_available_blocks} available")
        return [self.append_slot(seq_id, t) for t in token_ids]

    def reserve(self, seq_id: SeqId, token_ids: Sequence[int]) -> tuple[int, list[tuple[int, int]]]:
        """Slots for ``token_ids``: a new sequence is allocated (they are its prompt), a known one
        gets them appended (γ draft tokens to verify, a decode token).

        Returns:
            ``(start, copies)``: ``start`` is the position of the first token that still needs
            computing (prefix-cache hits of a new sequence are skipped), ``copies`` the
            copy-on-write ``(src, dst)`` block pairs the runner must copy before the forward.

        Raises:
            NoFreeBlocksError: not enough blocks; nothing changes.
        """
        if seq_id not in self._tables:
            return self.allocate(seq_id, token_ids), []
        start = self._num_slots[seq_id]
        slots = self.append_slots(seq_id, token_ids)
        return start, [(src, block) for block, _, src in slots if src is not None]

    def fork(self, parent_id: SeqId, child_id: SeqId) -> None:
        """The child shares all of the parent's blocks (every ref count +1, no copy yet).

        Raises:
            ValueError: unknown or swapped parent, or a child id that already exists.
        """
        if child_id in self._tables:
            raise ValueError(f"child_id {child_id!r} already has blocks")
        if parent_id in self._swapped:
            raise ValueError(f"parent {parent_id!r} is swapped out; swap_in first")
        table = self._table(parent_id)
        for block_id in table:
            self.pool.acquire(block_id)
        self._tables[child_id] = list(table)
        self._num_slots[child_id] = self._num_slots[parent_id]
        self._chain[child_id] = list(self._chain[parent_id])

    def truncate(self, seq_id: SeqId, num_tokens: int) -> list[int]:
        """Keep only the first ``num_tokens`` slots of a sequence (roll back rejected draft tokens).

        Blocks past the new end are released; the next :meth:`append_slot` overwrites the
        rolled-back slots (copying first if the last block is shared).

        Returns:
            the physical blocks this sequence stopped holding.

        Raises:
            ValueError: ``num_tokens`` outside ``[0, num_tokens(seq_id)]``, or a swapped sequence.
        """
        table, n = self._table(seq_id), self._num_slots[seq_id]
        if seq_id in self._swapped:
            raise ValueError(f"sequence {seq_id!r} is swapped out; swap_in first")
        num_tokens = check_int("num_tokens", num_tokens, 0, n, hint=f" for sequence {seq_id!r}")
        keep = self.blocks_needed(num_tokens)
        dropped = table[keep:]
        for block_id in reversed(dropped):
            self.pool.release(block_id)
        del table[keep:]
        offset = num_tokens % self.block_size
        if offset and self.blocks[table[-1]].ref_count == 1:    # we alone hold it: forget the tail
            block = self.blocks[table[-1]]
            self.pool.unregister(block)
            del block.token_ids[offset:]
        self._num_slots[seq_id] = num_tokens
        del self._chain[seq_id][num_tokens // self.block_size:]
        return dropped

    def free(self, seq_id: SeqId) -> None:
        """Release all of a sequence's blocks (GPU or, if swapped out, CPU).

        Blocks are released last block first, so under LRU the tail of a cached prefix is
        evicted before its head (the head is the part other prompts are likeliest to share).

        Raises:
            ValueError: unknown sequence.
        """
        table = self._table(seq_id)
        if seq_id in self._swapped:
            for block_id in table:
                self.swap_space.release(block_id)
            self._swapped.discard(seq_id)
        else:
            for block_id in reversed(table):
                self.pool.release(block_id)
        del self._tables[seq_id], self._num_slots[seq_id], self._chain[seq_id]

    # ------------------------------------------------------------------ checks
    def audit(self) -> None:
        """Check the bookkeeping: ref counts equal table references, every block in exactly one
        state, the hash table points at registered blocks with matching hashes.

        Raises:
            RuntimeError: describing the first inconsistency found.
        """
        refs = [0] * self.num_blocks
        for seq_id, table in self._tables.items():
            if seq_id in self._swapped:
                continue
            if len(table) != self.blocks_needed(self._num_slots[seq_id]):
                raise RuntimeError(f"sequence {seq_id!r}: {len(table)} blocks for {self._num_slots[seq_id]} tokens")
            for block_id in table:
                refs[block_id] += 1
        self.pool.audit(refs)
        self.swap_space.audit(sum(len(self._tables[s]) for s in self._swapped))
