"""CPU swap space: the blocks that hold a preempted sequence's KV until it comes back
(preemption by swap, Kwon et al. 2023). Pure bookkeeping, like the block pool."""

from __future__ import annotations

from collections import deque

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
