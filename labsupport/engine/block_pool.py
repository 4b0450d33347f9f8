"""The block pool: the physical KV blocks, their ref counts, and the prefix-cache hash index
(vLLM v1 calls this part ``BlockPool``; PagedAttention, Kwon et al., 2023).

Every physical block is always in exactly one state::

    free       ref 0, not registered        (in ``_free``)
    evictable  ref 0, registered            (in ``_evictable``, least recently used first)
    used       ref ≥ 1                      (in one or more block tables)

With *prefix caching* a full, computed block is registered in the hash index under a key
chained on its parent block's key and its own token ids, so the key depends on every token
before it. A lookup is confirmed by comparing the stored token ids and parent key: a hash
collision is a miss, never wrong data. A registered block whose ref count falls to 0 stays
in the index but becomes *evictable*; when it is taken for new data its index entry is
removed, so a later identical prefix is a miss, not a hit on overwritten data.

Pure Python bookkeeping: no tensors. Block tables live in
:class:`~labsupport.engine.block_manager.BlockManager`.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..validation import check_int


class NoFreeBlocksError(RuntimeError):
    """The pool has no free or evictable block left (check ``can_allocate`` / ``can_append`` first)."""


def block_hash(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """Prefix-cache key of a full block: ``hash((parent_hash, tuple(token_ids)))``.

    Chaining on the parent's key makes the key depend on *every* token before the block, so
    the same four tokens after two different prefixes get two different keys. Python's hash
    of a tuple of ints is deterministic (no per-process salt).
    """
    return hash((parent_hash, tuple(int(t) for t in token_ids)))


@dataclass
class Block:
    """One physical block (device pool or CPU swap space).

    Attributes:
        block_id: its index in the pool.
        ref_count: how many block tables hold it.
        token_ids: the token ids written into its slots so far (at most ``block_size``).
        hash: its prefix-cache key while registered, else ``None``.
        parent_hash: the chain key of the block before it (confirms a hit).
    """

    block_id: int
    ref_count: int = 0
    token_ids: list[int] = field(default_factory=list)
    hash: int | None = None
    parent_hash: int | None = None

    def reset(self) -> None:
        self.ref_count = 0
        self.token_ids = []
        self.hash = None
        self.parent_hash = None


class BlockPool:
    """``num_blocks`` physical blocks: taking and releasing them, and the prefix-cache index.

    Args:
        num_blocks: blocks in the pool, ≥ 1.
        hash_fn: ``(parent_hash, token_ids) -> int``; replaceable so a test can force collisions.

    Raises:
        TypeError / ValueError: ``num_blocks`` not an integer ≥ 1.

    Attributes:
        on_evict: ``None``, or a callable given each registered block just before eviction
            reuses it (its ``hash``, ``parent_hash``, ``token_ids`` and KV data still intact);
            KV tiers (:mod:`labsupport.serving.tiers`) copy it to a lower tier there.
    """

    def __init__(self, num_blocks: int, hash_fn: Callable[[int | None, Sequence[int]], int] = block_hash):
        self.num_blocks = check_int("num_blocks", num_blocks, 1)
        self.hash_fn = hash_fn
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self._free: deque[int] = deque(range(self.num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()    # LRU order: oldest first
        self._hash_index: dict[int, int] = {}                       # prefix key -> physical block id
        self.num_evictions = 0
        self.on_evict: Callable[[Block], None] | None = None       # KV tiering: demote before the data goes

    # ------------------------------------------------------------------ counts
    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0 that hold no registered prefix."""
        return len(self._free)

    @property
    def num_evictable_blocks(self) -> int:
        """Blocks with ref count 0 that still hold a registered prefix (reused on a hit, else evicted, LRU)."""
        return len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with ref count ≥ 1 (counted from the blocks themselves)."""
        return sum(1 for b in self.blocks if b.ref_count > 0)

    @property
    def num_available_blocks(self) -> int:
        """Blocks an allocation may take: free + evictable (an evictable block is evicted on demand)."""
        return len(self._free) + len(self._evictable)

    def is_registered(self, key: int) -> bool:
        """Whether a prefix key is in the hash index."""
        return key in self._hash_index

    # ------------------------------------------------------------------ take / release
    def take(self) -> Block:
        """A block for new data with ref count 1: a free one, else evict the least recently used.

        Raises:
            NoFreeBlocksError: none is free or evictable.
        """
        if self._free:
            block = self.blocks[self._free.popleft()]
        elif self._evictable:
            block_id, _ = self._evictable.popitem(last=False)
            block = self.blocks[block_id]
            if self.on_evict is not None:                           # a lower tier may keep a copy
                self.on_evict(block)
            if self._hash_index.get(block.hash) == block_id:
                del self._hash_index[block.hash]                    # evicted data can never be hit again
            block.reset()
            self.num_evictions += 1
        else:
            raise NoFreeBlocksError(f"no free block left in a pool of {self.num_blocks}")
        block.ref_count = 1
        return block

    def acquire(self, block_id: int) -> None:
        """One more reference to a block already holding data (a prefix hit or a fork)."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._evictable[block_id]
        block.ref_count += 1

    def release(self, block_id: int) -> None:
        """Drop one reference; at 0 the block becomes evictable (if registered) or free."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count > 0:
            return
        if block.hash is not None:
            self._evictable[block_id] = None                        # most recently used at the end
        else:
            block.reset()
            self._free.append(block_id)

    # ------------------------------------------------------------------ prefix-cache index
    def register(self, block: Block, key: int, parent: int | None) -> None:
        """Put a full, computed block in the hash index (no-op if it or an identical block is there)."""
        if block.hash is None and key not in self._hash_index:
            block.hash, block.parent_hash = key, parent
            self._hash_index[key] = block.block_id

    def unregister(self, block: Block) -> None:
        """Take a block out of the hash index (its contents are about to change)."""
        if block.hash is not None and self._hash_index.get(block.hash) == block.block_id:
            del self._hash_index[block.hash]
        block.hash = block.parent_hash = None

    def lookup(self, parent: int | None, token_ids: list[int]) -> tuple[int, int] | None:
        """``(key, block_id)`` of the registered block holding ``token_ids`` after ``parent``, or ``None``.

        A key found in the index counts only if the block's stored token ids and parent key
        match: a hash collision is a miss.
        """
        key = self.hash_fn(parent, token_ids)
        block_id = self._hash_index.get(key)
        if block_id is None:
            return None
        block = self.blocks[block_id]
        if block.token_ids != token_ids or block.parent_hash != parent:
            return None
        return key, block_id

    def match_prefix(self, token_ids: Sequence[int], block_size: int) -> list[tuple[int, int]]:
        """``(key, block_id)`` of the registered full blocks ``token_ids`` starts with, in order.

        Only blocks that end before the last token count, so at least one token is always left
        to compute (its logits give the next token). The match ends at the first miss (a block
        not registered, or a collision).
        """
        hits: list[tuple[int, int]] = []
        parent = None
        for i in range((len(token_ids) - 1) // block_size):
            hit = self.lookup(parent, [int(t) for t in token_ids[i * block_size:(i + 1) * block_size]])
            if hit is None:
                break
            hits.append(hit)
            parent = hit[0]
        return hits

    def register_full_blocks(self, table: list[int], chain: list[int], num_full: int, block_size: int) -> None:
        """Register a sequence's full, computed blocks ``chain[len(chain):num_full]`` of ``table``;
        ``chain`` (the keys of its blocks registered so far) grows in place."""
        for i in range(len(chain), num_full):
            block = self.blocks[table[i]]
            parent = chain[-1] if chain else None
            key = self.hash_fn(parent, block.token_ids[:block_size])
            chain.append(key)
            self.register(block, key, parent)

    # ------------------------------------------------------------------ checks
    def audit(self, refs: list[int]) -> None:
        """Check ref counts against ``refs`` (table references per block), each block in exactly one
        state, and the hash index pointing at registered blocks with matching keys.

        Raises:
            RuntimeError: describing the first inconsistency found.
        """
        for block in self.blocks:
            if block.ref_count != refs[block.block_id]:
                raise RuntimeError(f"block {block.block_id}: ref count {block.ref_count}, "
                                   f"{refs[block.block_id]} table references")
        free, evictable = set(self._free), set(self._evictable)
        if len(free) != len(self._free) or free & evictable:
            raise RuntimeError("a block is listed twice in the free / evictable sets")
        for block in self.blocks:
            states = (block.block_id in free) + (block.block_id in evictable) + (block.ref_count > 0)
            if states != 1:
                raise RuntimeError(f"block {block.block_id} is in {states} states (free/evictable/used)")
            if block.block_id in evictable and block.hash is None:
                raise RuntimeError(f"evictable block {block.block_id} has no hash")
        for key, block_id in self._hash_index.items():
            if self.blocks[block_id].hash != key:
                raise RuntimeError(f"hash entry points at block {block_id}, which holds another hash")
        if self.num_free_blocks + self.num_evictable_blocks + self.num_used_blocks != self.num_blocks:
            raise RuntimeError("free + evictable + used != num_blocks")
