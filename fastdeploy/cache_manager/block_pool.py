"""The pool of KV-cache blocks: reference counts, the prefix cache, and the free queue. Plain Python.

Block 0 is the null block: it pads block tables for the attention kernels and is never handed
out, so a pool of `num_blocks` serves `num_blocks - 1` blocks.

Prefix caching (the design of vLLM's KVCacheManager and FastDeploy's PrefixCacheManager): a full
block whose tokens are in the cache can be registered under the SHA-256 of (parent block's key,
its token ids, extra keys); a later sequence with the same tokens from position 0 finds it by
walking the chain. A hit is confirmed by comparing the token ids and the parent key, and a
sequence whose key turns out to name other content (a collision) registers no further blocks, so
every registered key names exactly one prefix and a collision can never serve wrong KV. A block is shared by reference count. A block nobody uses is
free: it sits in the LRU free queue, still holding its KV and its hash, until it is handed out
again (then it leaves the cache). Blocks without a hash go to the front of the queue (reused
first), cached ones to the back; callers free a sequence's blocks tail first, so a sequence's tail
is evicted before the prefix it may share with others.
"""
import hashlib
from collections import OrderedDict
from typing import Optional

import numpy as np

NULL_BLOCK_ID = 0


def hash_block(parent_hash: Optional[bytes], token_ids: tuple, extra_keys: tuple = ()) -> bytes:
    """The key of a full block: SHA-256 of its parent's key, its token ids and extra keys (e.g. the
    hashes of multimodal items it covers; () for text). A cryptographic hash, so a key names one
    whole prefix; lookups still confirm the tokens and the parent key."""
    h = hashlib.sha256(parent_hash or b"")
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return h.digest()


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))  # front = next out
        self._hash: list[Optional[bytes]] = [None] * num_blocks
        self._tokens: list[Optional[tuple]] = [None] * num_blocks
        self._parent: list[Optional[bytes]] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}  # block hash -> block id

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody uses (cached or not): what allocate can hand out."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Hand out `n` free blocks (evicting their cached content); raises RuntimeError if fewer are free."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} KV blocks, {len(self._free)} free")
        blocks = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            self._evict(block_id)
            self.ref_counts[block_id] = 1
            blocks.append(block_id)
        return blocks

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference to each block, in the given order (pass a sequence's blocks tail first).

        Raises RuntimeError for a block that is not in use.
        """
        for block_id in block_ids:
            if not 0 < block_id < self.num_blocks or self.ref_counts[block_id] <= 0:
                raise RuntimeError(f"KV block {block_id} freed but not in use")
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self._free[block_id] = None
                if self._hash[block_id] is None:
                    self._free.move_to_end(block_id, last=False)

    def touch(self, block_ids: list[int]) -> None:
        """Take one more reference to each block (prefix-cache hits), taking free ones off the queue."""
        for block_id in block_ids:
            if self.ref_counts[block_id] == 0:
                del self._free[block_id]
            self.ref_counts[block_id] += 1

    # ---- prefix cache ---------------------------------------------------------------------------
    def cache_block(self, block_id: int, block_hash: bytes, token_ids: tuple, parent_hash: Optional[bytes]) -> bool:
        """Register a full, computed block under `block_hash`. If another block already holds the
        same content, that one stays the cached copy (block tables are append-only, so no
        de-duplication). Returns False when the hash is held by different content (a collision):
        the caller must then stop registering that sequence's later blocks."""
        holder = self._cached.get(block_hash)
        if holder is not None:
            return self._tokens[holder] == token_ids and self._parent[holder] == parent_hash
        if self._hash[block_id] is None:
            self._cached[block_hash] = block_id
            self._hash[block_id], self._tokens[block_id], self._parent[block_id] = block_hash, token_ids, parent_hash
        return True

    def lookup(self, block_hash: bytes, token_ids: tuple, parent_hash: Optional[bytes]) -> Optional[int]:
        """The cached block with exactly this content and parent, or None."""
        block_id = self._cached.get(block_hash)
        if block_id is None or self._tokens[block_id] != token_ids or self._parent[block_id] != parent_hash:
            return None
        return block_id

    def uncache_block(self, block_id: int) -> None:
        """Forget the block's prefix-cache entry (its KV was never written: the step failed)."""
        self._evict(block_id)
        if self.ref_counts[block_id] == 0 and block_id in self._free:  # reused first, like any uncached block
            self._free.move_to_end(block_id, last=False)

    def is_free(self, block_id: int) -> bool:
        return self.ref_counts[block_id] == 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (their KV stays until overwritten, but is never matched again)."""
        for block_id in self._cached.values():
            self._hash[block_id] = self._tokens[block_id] = self._parent[block_id] = None
        self._cached.clear()

    def _evict(self, block_id: int) -> None:
        block_hash = self._hash[block_id]
        if block_hash is not None:
            del self._cached[block_hash]
            self._hash[block_id] = self._tokens[block_id] = self._parent[block_id] = None
