"""CPU swap space: the blocks that hold a preempted sequence's KV until it comes back
(preemption by swap, Kwon et al. 2023). Pure bookkeeping, like the block pool."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from .block_pool import Block, NoFreeBlocksError


class SwapSpace:
    """``num_blocks`` CPU blocks, each holding a copy of one device block's token ids.

    Raises:
        NoFreeBlocksError: from :meth:`take` when every CPU block is in use.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def take(self, token_ids: list[int]) -> int:
        """A CPU block for a copy of a device block holding ``token_ids``; its id."""
        if not self._free:
            raise NoFreeBlocksError(f"no free CPU block left in a swap space of {self.num_blocks}")
        block = self.blocks[self._free.popleft()]
        block.ref_count, block.token_ids = 1, list(token_ids)
        return block.block_id

    def release(self, block_id: int) -> list[int]:
        """Give a CPU block back; returns the token ids it held."""
        block = self.blocks[block_id]
        token_ids = block.token_ids
        block.reset()
        self._free.append(block_id)
        return token_ids

    def audit(self, num_used: int) -> None:
        """Check that ``num_used`` (blocks held by swapped sequences) + free = all.

        Raises:
            RuntimeError: they do not add up.
        """
        if num_used + len(self._free) != self.num_blocks:
            raise RuntimeError(f"CPU blocks: {num_used} used + {len(self._free)} free != {self.num_blocks}")


class BlockSwapping:
    """The block manager's preemption by swap (mixed into
    :class:`~labsupport.engine.block_manager.BlockManager`): a sequence's blocks move to this
    swap space and back into fresh pool blocks; the returned block pairs are what the runner copies.
    It reads the manager's tables (``_table``, ``_swapped``, ``_num_slots``, ``_chain``), its ``pool``
    and its ``swap_space``."""

    def can_swap_out(self, seq_id: Hashable) -> bool:
        return len(self._table(seq_id)) <= self.swap_space.num_free_blocks

    def swap_out(self, seq_id: Hashable) -> dict[int, int]:
        """Move a sequence's blocks to CPU swap space.

        Returns:
            ``{gpu_block: cpu_block}``: the runner copies each GPU block to its CPU block
            *before* the freed GPU blocks are written again.

        Raises:
            ValueError: unknown or already swapped sequence.
            NoFreeBlocksError: not enough CPU blocks (check :meth:`can_swap_out`).
        """
        if seq_id in self._swapped:
            raise ValueError(f"sequence {seq_id!r} is already swapped out")
        table = self._table(seq_id)
        if not self.can_swap_out(seq_id):
            raise NoFreeBlocksError(f"sequence {seq_id!r} needs {len(table)} CPU blocks, "
                                    f"{self.swap_space.num_free_blocks} free")
        mapping = {}
        for i, block_id in enumerate(table):
            mapping[block_id] = table[i] = self.swap_space.take(self.blocks[block_id].token_ids)
        for block_id in reversed(list(mapping)):
            self.pool.release(block_id)
        self._swapped.add(seq_id)
        return mapping

    def can_swap_in(self, seq_id: Hashable) -> bool:
        return len(self._table(seq_id)) <= self.num_available_blocks

    def swap_in(self, seq_id: Hashable) -> dict[int, int]:
        """Bring a swapped-out sequence back into the GPU pool (into fresh blocks).

        Returns:
            ``{cpu_block: gpu_block}`` for the runner to copy.

        Raises:
            ValueError: the sequence is not swapped out.
            NoFreeBlocksError: not enough GPU blocks (check :meth:`can_swap_in`).
        """
        if seq_id not in self._swapped:
            raise ValueError(f"sequence {seq_id!r} is not swapped out")
        table = self._table(seq_id)
        if not self.can_swap_in(seq_id):
            raise NoFreeBlocksError(f"sequence {seq_id!r} needs {len(table)} blocks, "
                                    f"{self.num_available_blocks} available")
        mapping = {}
        for i, cpu_id in enumerate(table):
            block = self.pool.take()
            block.token_ids = list(self.swap_space.release(cpu_id))
            mapping[cpu_id] = block.block_id
            table[i] = block.block_id
        self._swapped.discard(seq_id)
        self._chain[seq_id] = []                                # re-registered by mark_computed
        self.mark_computed(seq_id, self._num_slots[seq_id])
        return mapping
