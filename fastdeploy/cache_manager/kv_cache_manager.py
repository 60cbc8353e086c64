"""KVCacheManager: the KV blocks of every request, between the scheduler and the block pool. Plain Python.

The scheduler decides who runs and how many tokens each computes (policy); it asks this manager
for the blocks (mechanism), the seam of vLLM v1's `KVCacheManager`:

- `get_computed_blocks(request)`: the longest cached prefix of a request about to be admitted;
- `allocate_slots(request, num_new_tokens, ...)`: blocks for `num_new_tokens` more tokens (taking
  the prefix hit on admission), or None when the pool cannot give them;
- `cache_blocks(request, num_tokens)`: register the request's full blocks in the prefix cache;
- `free(request)`: return its blocks to the pool (their cached content stays until reused);
- `begin_step` / `commit_step` / `rollback_step`: the undo record of the step being built.

A request's block table is `Request.block_ids` (block i holds tokens i * block_size ..
(i + 1) * block_size - 1), with `Request.block_hashes` (prefix-cache keys of its leading full
blocks) and `Request.prefix_chain_broken`; only this manager writes them.

Prefix keys: block i's key is `hash_block(parent key, its tokens, block_extra_keys(...))`
(cache_manager/block_pool.py), a chain from the first block, so a key names the whole prefix; a
lookup confirms the tokens and the parent key too.

Invariants: a block's reference count equals the number of block tables holding it; a request
holds ceil((num_computed_tokens + scheduled + num_lookahead_tokens) / block_size) blocks after
`allocate_slots`, none after `free`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fastdeploy.cache_manager.block_pool import BlockPool, hash_block
from fastdeploy.engine.request import Request


@dataclass
class ComputedBlocks:
    """A cached prefix: its block ids and their prefix keys, `num_tokens` tokens in all."""

    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_tokens: int = 0


class KVCacheManager:
    def __init__(self, block_pool: BlockPool, block_size: int, enable_caching: bool = True) -> None:
        """block_pool: the pool the blocks come from; block_size: tokens per block (> 0);
        enable_caching: find and register prefix-cache blocks (False: every request computes all)."""
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive number of tokens, got {block_size}")
        self.block_pool = block_pool
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._step = _StepRecord()

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks holding `num_tokens` tokens: ceil(num_tokens / block_size)."""
        return -(-num_tokens // self.block_size)

    def num_tokens_fitting(self, request: Request) -> int:
        """Tokens `request` could hold if it took every free block (its own blocks included)."""
        return (len(request.block_ids) + self.block_pool.num_free_blocks) * self.block_size

    # ---- prefix cache -----------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> ComputedBlocks:
        """The longest cached prefix of a request about to be admitted: at most
        (num_tokens - 1) // block_size whole blocks, so at least one token is computed and the step
        yields its logits. A request that scores its prompt (prompt logprobs) reads no cache: every
        prompt position's logits must be computed. Takes no reference: `allocate_slots` does."""
        prefix = ComputedBlocks()
        if not self.enable_caching or request.wants_prompt_logprobs:
            return prefix
        parent = None
        for i in range((request.num_tokens - 1) // self.block_size):
            tokens = self._block_tokens(request, i)
            block_hash = hash_block(parent, tokens, block_extra_keys(request, i, self.block_size))
            block_id = self.block_pool.lookup(block_hash, tokens, parent)
            if block_id is None:
                break
            prefix.block_ids.append(block_id)
            prefix.block_hashes.append(block_hash)
            parent = block_hash
        prefix.num_tokens = len(prefix.block_ids) * self.block_size
        return prefix

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's blocks that are full within its first `num_tokens` tokens.

        The scheduler calls it for the tokens a step will compute, once the step can no longer
        preempt the request: the model writes every K/V of a step before any attention reads the
        cache, so a request admitted later in the same step can already share them. A failed step
        is undone by `rollback_step`, which forgets the blocks registered since `begin_step`.
        """
        if not self.enable_caching or request.prefix_chain_broken:
            return
        self._step.hash_marks.setdefault(request, len(request.block_hashes))
        for i in range(len(request.block_hashes), num_tokens // self.block_size):
            tokens = self._block_tokens(request, i)
            parent = request.block_hashes[-1] if request.block_hashes else None
            block_hash = hash_block(parent, tokens, block_extra_keys(request, i, self.block_size))
            if not self.block_pool.cache_block(request.block_ids[i], block_hash, tokens, parent):
                # the key names other content (a collision): later blocks would name a parent that
                # is not theirs, so this sequence registers nothing more
                request.prefix_chain_broken = True
                return
            if self.block_pool.lookup(block_hash, tokens, parent) == request.block_ids[i]:
                self._step.registered.append(request.block_ids[i])  # registered now (not held by another)
            request.block_hashes.append(block_hash)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; later requests get no hit. Returns True."""
        self.block_pool.reset_prefix_cache()
        return True

    # ---- allocation -------------------------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: Optional[ComputedBlocks] = None,
                       num_lookahead_tokens: int = 0) -> Optional[list[int]]:
        """Blocks for `num_new_tokens` more tokens of `request`, after its `num_computed_tokens`.

        new_computed_blocks: on admission (the request holds no block), its prefix hit from
            `get_computed_blocks`: the block table becomes the hit's blocks (one more reference
            each) followed by the new ones, and the new tokens follow the hit's tokens.
        num_lookahead_tokens: slots reserved beyond the new tokens: where a draft model writes the
            K/V of its later drafts after the step (speculative decoding, `free_slots_after` returns
            them). A prefill-only request (pooling) needs none: its blocks cover exactly its prompt.
        Returns the blocks added to the table (possibly none), or None, changing nothing, when the
        pool has too few free blocks (free cached hits count against it: taking them removes them
        from the free queue).
        """
        if num_new_tokens < 0 or num_lookahead_tokens < 0:
            raise ValueError(f"num_new_tokens and num_lookahead_tokens must be >= 0, got {num_new_tokens} "
                             f"and {num_lookahead_tokens}")
        hits = new_computed_blocks or ComputedBlocks()
        total = request.num_computed_tokens + hits.num_tokens + num_new_tokens + num_lookahead_tokens
        held = len(request.block_ids) + len(hits.block_ids)
        need = max(self.blocks_needed(total) - held, 0)
        reclaimed = sum(1 for b in hits.block_ids if self.block_pool.is_free(b))  # hits in the free queue
        if not self.block_pool.can_allocate(need + reclaimed):
            return None
        if new_computed_blocks is None:
            self._step.blocks_before.setdefault(request, len(request.block_ids))
        else:
            self.block_pool.touch(hits.block_ids)  # before allocate, so allocate cannot evict them
            request.block_ids = list(hits.block_ids)
            request.block_hashes = list(hits.block_hashes)
        new_blocks = self.block_pool.allocate(need)
        request.block_ids.extend(new_blocks)
        return new_blocks

    def free_slots_after(self, request: Request, num_tokens: int) -> None:
        """Return the blocks past the first ceil(num_tokens / block_size) of the request's table to the
        pool, tail first: slots reserved for drafts that were rejected, or lookahead. They hold no
        prefix-cache block (those are full within the request's tokens)."""
        keep = self.blocks_needed(num_tokens)
        if len(request.block_ids) > keep:
            self.block_pool.free(request.block_ids[keep:][::-1])
            del request.block_ids[keep:]

    def free(self, request: Request) -> None:
        """Return the request's blocks to the pool, tail first (evicted before a prefix it may
        share); cached ones keep their content until reused. Its block table is left empty."""
        self.block_pool.free(request.block_ids[::-1])
        request.block_ids = []
        request.block_hashes = []
        request.prefix_chain_broken = False

    # ---- the step's undo record -------------------------------------------------------------------
    def begin_step(self) -> None:
        """A step is being built: record from here what `rollback_step` undoes."""
        self._step = _StepRecord()

    def commit_step(self) -> None:
        """The step ran: its K/V are in the cache, nothing is left to undo."""
        self._step = _StepRecord()

    def rollback_step(self) -> None:
        """Undo the blocks side of the step since `begin_step` (it failed: its K/V were never
        written): blocks it registered in the prefix cache are forgotten, prefix keys it added
        dropped, and blocks `allocate_slots` gave requests already holding blocks freed again.
        Requests admitted in the step keep their blocks: the scheduler frees them as it requeues them."""
        step, self._step = self._step, _StepRecord()
        for block_id in step.registered:
            self.block_pool.uncache_block(block_id)
        for request, marks in step.hash_marks.items():
            del request.block_hashes[marks:]
            request.prefix_chain_broken = False
        for request, kept in step.blocks_before.items():  # a request preempted since holds none
            self.block_pool.free(request.block_ids[kept:][::-1])
            del request.block_ids[kept:]

    def _block_tokens(self, request: Request, i: int) -> tuple:
        return tuple(request.token_ids_between(i * self.block_size, (i + 1) * self.block_size))


def block_extra_keys(request: Request, i: int, block_size: int) -> tuple:
    """What block `i`'s prefix-cache key mixes in besides its tokens: the request's `extra_keys` and the
    `mm_hash` of every image/video whose placeholder tokens overlap the block (placeholder ids are the
    same for every image, so the hash is what tells two images apart; FastDeploy does the same)."""
    start, end = i * block_size, (i + 1) * block_size
    return request.extra_keys + tuple(f.mm_hash for f in request.mm_features
                                      if f.offset < end and f.offset + f.length > start)


class _StepRecord:
    """What the step being built did to blocks, for `rollback_step`."""

    def __init__(self) -> None:
        self.registered: list[int] = []  # blocks registered in the prefix cache
        self.hash_marks: dict[Request, int] = {}  # len(block_hashes) before the step
        self.blocks_before: dict[Request, int] = {}  # len(block_ids) before the step gave a request more
