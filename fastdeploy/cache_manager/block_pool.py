"""The pool of KV-cache blocks: which physical blocks are free. Plain Python, no tensors.

Block 0 is the null block: it pads block tables for the attention kernels and is never handed
out, so a pool of `num_blocks` serves `num_blocks - 1` blocks. Callers ask `can_allocate` before
`allocate`, so an allocation is never half done. Freed blocks go to the end of the free list and
are handed out last-freed-last (FIFO), so a sequence's blocks are reused in the order they left.
"""
from collections import deque

NULL_BLOCK_ID = 0


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))
        self._used: set[int] = set()

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Hand out `n` free block ids; raises RuntimeError if fewer are free (ask can_allocate)."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(n)]
        self._used.update(blocks)
        return blocks

    def free(self, block_ids: list[int]) -> None:
        """Return blocks to the pool; freeing a block that is not in use raises RuntimeError."""
        for block_id in block_ids:
            if block_id not in self._used:
                raise RuntimeError(f"KV block {block_id} freed but not in use")
            self._used.remove(block_id)
            self._free.append(block_id)
