"""Prefix cache of the BlockPool (no model): hash-chain hits, confirmation by tokens and parent,
forced hash collisions, reference counts of shared blocks, the LRU free queue and eviction order,
`reset_prefix_cache`, and the null block.

Oracles: a small "sequence" helper registers a token sequence block by block exactly as the
scheduler does (hash of (parent hash, tokens)), and a chain walk looks a sequence up again; the
expected block ids, ref counts and free counts follow from arithmetic on what was allocated.
"""
from __future__ import annotations

import random

import pytest

from fastdeploy.cache_manager import block_pool as block_pool_module
from fastdeploy.cache_manager.block_pool import NULL_BLOCK_ID, BlockPool, hash_block

BS = 4  # tokens per block in these tests


def blocks_of(tokens: list[int]) -> list[tuple]:
    """The full blocks of a token sequence."""
    return [tuple(tokens[i : i + BS]) for i in range(0, len(tokens) - len(tokens) % BS, BS)]


def register(pool: BlockPool, tokens: list[int], block_ids: list[int]) -> list[int]:
    """Register the full blocks of `tokens` held in `block_ids`, as the scheduler does; their hashes."""
    hashes, parent = [], None
    for block_id, block in zip(block_ids, blocks_of(tokens)):
        h = block_pool_module.hash_block(parent, block)
        pool.cache_block(block_id, h, block, parent)
        hashes.append(h)
        parent = h
    return hashes


def walk(pool: BlockPool, tokens: list[int]) -> list[int]:
    """The cached prefix of `tokens`: block ids found by walking the hash chain from position 0."""
    found, parent = [], None
    for block in blocks_of(tokens):
        h = block_pool_module.hash_block(parent, block)
        block_id = pool.lookup(h, block, parent)
        if block_id is None:
            break
        found.append(block_id)
        parent = h
    return found


def seq(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


# ---- hash-chain hits ------------------------------------------------------------------------------
def test_hash_chain_hits_every_full_block_of_a_registered_sequence():
    pool = BlockPool(20)
    tokens = seq(1, 5 * BS + 2)  # 5 full blocks and a partial one
    ids = pool.allocate(6)
    hashes = register(pool, tokens, ids)
    assert len(hashes) == 5 and pool.num_cached_blocks == 5  # the partial block is never registered
    assert walk(pool, tokens) == ids[:5]
    # any prefix of the sequence finds the blocks it covers fully
    for n in range(len(tokens) + 1):
        assert walk(pool, tokens[:n]) == ids[: n // BS]
    # a longer sequence that continues it shares exactly those 5 blocks
    assert walk(pool, tokens + seq(2, 3 * BS)) == ids[:5]
    # a sequence differing in block 3 shares blocks 0..2 only
    other = list(tokens)
    other[3 * BS + 1] += 1
    assert walk(pool, other) == ids[:3]
    # a different first token: no hit at all
    assert walk(pool, [tokens[0] + 1] + tokens[1:]) == []


def test_same_block_tokens_after_a_different_prefix_is_a_miss():
    pool = BlockPool(20)
    a = seq(3, 3 * BS)
    ids = pool.allocate(3)
    register(pool, a, ids)
    block2 = a[2 * BS :]
    # block 2's tokens behind another prefix: the chain differs from the first block on
    b = seq(4, 2 * BS) + block2
    assert walk(pool, b) == []
    # even when asked directly with block 2's tokens, a different parent is not block 2
    other_parent = hash_block(None, tuple(seq(5, BS)))
    assert pool.lookup(hash_block(other_parent, tuple(block2)), tuple(block2), other_parent) is None
    assert pool.lookup(hash_block(None, tuple(block2)), tuple(block2), None) is None  # as a first block
    # the true chain still finds it
    assert walk(pool, a) == ids


def test_lookup_confirms_tokens_on_a_forced_hash_collision():
    pool = BlockPool(10)
    x, y = pool.allocate(2)
    colliding = 12345
    pool.cache_block(x, colliding, (1, 2, 3, 4), None)
    # another block with different tokens under the same hash: the first stays the cached copy
    pool.cache_block(y, colliding, (5, 6, 7, 8), None)
    assert pool.num_cached_blocks == 1
    assert pool.lookup(colliding, (1, 2, 3, 4), None) == x
    assert pool.lookup(colliding, (5, 6, 7, 8), None) is None  # never x: its tokens differ
    # same hash and tokens, but another parent: a miss too
    assert pool.lookup(colliding, (1, 2, 3, 4), 999) is None


def test_monkeypatched_constant_hash_never_returns_a_block_with_other_tokens(monkeypatch):
    """Every block hashes alike: lookups may miss, but a hit always holds the asked tokens/parent."""
    monkeypatch.setattr(block_pool_module, "hash_block", lambda parent, tokens, extra=(): 7)
    pool = BlockPool(40)
    rng = random.Random(0)
    content: dict[int, tuple] = {}  # block id -> (tokens, parent) it was registered with
    for i in range(30):
        tokens = [rng.randrange(4) for _ in range(rng.randint(BS, 3 * BS))]
        ids = pool.allocate(len(blocks_of(tokens)))
        parent = None
        for block_id, block in zip(ids, blocks_of(tokens)):
            pool.cache_block(block_id, 7, block, parent)
            content[block_id] = (block, parent)  # what the block holds now (its last write)
            parent = 7
        pool.free(ids[::-1])
    assert pool.num_cached_blocks == 1  # one hash: one cached block
    for _ in range(300):
        block = tuple(rng.randrange(4) for _ in range(BS))
        parent = rng.choice([None, 7])
        hit = pool.lookup(7, block, parent)
        if hit is not None:
            assert content[hit] == (block, parent)


# ---- reference counts ---------------------------------------------------------------------------
def test_ref_counts_of_shared_blocks_under_touch_and_free():
    pool = BlockPool(10)  # 9 usable
    prefix = seq(6, 2 * BS)
    a_tokens = prefix + seq(7, BS)
    a = pool.allocate(3)
    register(pool, a_tokens, a)
    # b shares the 2 prefix blocks, and has its own third block
    b_tokens = prefix + seq(8, BS)
    hits = walk(pool, b_tokens)
    assert hits == a[:2]
    pool.touch(hits)
    b = hits + pool.allocate(1)
    assert [pool.ref_counts[i] for i in a] == [2, 2, 1]
    assert pool.ref_counts[b[2]] == 1
    assert pool.num_free_blocks == 9 - 4
    # a third sharer
    pool.touch(hits)
    assert [pool.ref_counts[i] for i in hits] == [3, 3]
    pool.free(hits[::-1])
    # a leaves: its tail is free, the shared blocks are still held by b
    pool.free(a[::-1])
    assert [pool.ref_counts[i] for i in a] == [1, 1, 0]
    assert pool.num_free_blocks == 9 - 3
    assert not pool.is_free(a[0]) and pool.is_free(a[2])
    pool.free(b[::-1])
    assert all(c == 0 for c in pool.ref_counts)
    assert pool.num_free_blocks == pool.num_usable_blocks
    # one more free of a block nobody holds is an error, and changes nothing
    with pytest.raises(RuntimeError, match="freed but not in use"):
        pool.free([a[0]])
    assert pool.ref_counts[a[0]] == 0 and pool.num_free_blocks == 9


def test_touching_a_cached_free_block_takes_it_off_the_free_queue():
    pool = BlockPool(6)  # 5 usable
    tokens = seq(9, 2 * BS)
    ids = pool.allocate(2)
    register(pool, tokens, ids)
    pool.free(ids[::-1])
    assert pool.num_free_blocks == 5 and pool.num_cached_blocks == 2
    hits = walk(pool, tokens)
    assert hits == ids
    pool.touch(hits)
    assert pool.num_free_blocks == 3 and [pool.ref_counts[i] for i in ids] == [1, 1]
    rest = pool.allocate(3)  # everything else: never a touched block
    assert set(rest).isdisjoint(ids)
    assert not pool.can_allocate(1)
    assert walk(pool, tokens) == ids  # still cached: in use, not evicted
    pool.free(rest)
    pool.free(ids[::-1])
    assert pool.num_free_blocks == 5


# ---- free queue and eviction ------------------------------------------------------------------------
def test_cached_free_block_stays_findable_until_handed_out():
    pool = BlockPool(5)  # 4 usable
    tokens = seq(10, BS)
    (x,) = pool.allocate(1)
    register(pool, tokens, [x])
    pool.free([x])
    for _ in range(3):  # the 3 never-used blocks go first; x survives each allocation
        held = pool.allocate(1)
        assert held != [x]
        assert walk(pool, tokens) == [x]
    assert pool.allocate(1) == [x]  # the last free block: x is evicted
    assert walk(pool, tokens) == []
    assert pool.num_cached_blocks == 0
    # x was handed out with ref count 1 and carries no hash: freeing it puts it first in line
    pool.free([x])
    assert pool.allocate(1) == [x]


def test_uncached_freed_blocks_are_reused_before_cached_ones():
    pool = BlockPool(7)  # 6 usable
    all_ids = pool.allocate(6)
    cached, plain = all_ids[:3], all_ids[3:]
    register(pool, seq(11, 3 * BS), cached)
    pool.free(cached[::-1])
    pool.free(plain[::-1])  # freed later, but without content: reused first
    assert sorted(pool.allocate(3)) == sorted(plain)
    assert pool.num_cached_blocks == 3


def test_tail_is_evicted_first_and_the_shared_prefix_survives_longest():
    pool = BlockPool(12)  # 11 usable
    prefix = seq(12, 2 * BS)
    a_tokens, b_tokens = prefix + seq(13, 2 * BS), prefix + seq(14, 2 * BS)
    a = pool.allocate(4)
    register(pool, a_tokens, a)
    hits = walk(pool, b_tokens)
    assert hits == a[:2]
    pool.touch(hits)
    b = hits + pool.allocate(2)
    register(pool, b_tokens, b)
    assert pool.num_cached_blocks == 6
    untouched = 11 - 6  # blocks never used: handed out before any cached block
    keys = {}  # block id -> (hash, tokens, parent) it is cached under
    for tokens, ids in ((a_tokens, a), (b_tokens, b)):
        parent = None
        for block_id, block in zip(ids, blocks_of(tokens)):
            h = hash_block(parent, block)
            keys.setdefault(block_id, (h, block, parent))
            parent = h
    pool.free(a[::-1])  # a's tail (a3, a2) goes to the back; the prefix is still held by b
    pool.free(b[::-1])  # b's tail (b3, b2), then the prefix (p1, p0) last
    assert pool.num_free_blocks == 11
    expected_order = [a[3], a[2], b[3], b[2], a[1], a[0]]
    assert sorted(expected_order) == sorted(keys)
    assert len(pool.allocate(untouched)) == untouched
    assert all(pool.lookup(*keys[i]) == i for i in keys)  # never-used blocks went first
    for k, victim in enumerate(expected_order):
        assert pool.allocate(1) == [victim], f"eviction {k}"
        assert pool.lookup(*keys[victim]) is None
        assert all(pool.lookup(*keys[i]) == i for i in expected_order[k + 1 :])
    assert pool.num_cached_blocks == 0 and pool.num_free_blocks == 0


def test_freeing_head_first_would_evict_the_prefix_first():
    """The order is the caller's: the pool keeps the order of free calls for cached blocks."""
    pool = BlockPool(4)
    tokens = seq(15, 3 * BS)
    ids = pool.allocate(3)
    register(pool, tokens, ids)
    pool.free(ids)  # head first (what callers must not do)
    assert pool.allocate(1) == [ids[0]]
    assert walk(pool, tokens) == []  # the chain is broken at its head


# ---- reset and the null block ----------------------------------------------------------------------
def test_reset_prefix_cache_forgets_everything():
    pool = BlockPool(12)
    t1, t2 = seq(16, 3 * BS), seq(17, 2 * BS)
    a = pool.allocate(3)
    b = pool.allocate(2)
    register(pool, t1, a)
    register(pool, t2, b)
    pool.free(a[::-1])  # a free (cached), b still in use (cached)
    assert pool.num_cached_blocks == 5
    pool.reset_prefix_cache()
    assert pool.num_cached_blocks == 0
    assert walk(pool, t1) == [] and walk(pool, t2) == []
    # accounting unaffected: b still held, the rest free
    assert pool.num_free_blocks == 11 - 2 and [pool.ref_counts[i] for i in b] == [1, 1]
    # the blocks can be registered again and found again
    register(pool, t2, b)
    assert walk(pool, t2) == b
    pool.free(b[::-1])
    assert pool.num_free_blocks == 11


def test_reset_blocks_are_reused_as_plain_free_blocks():
    pool = BlockPool(5)  # 4 usable
    tokens = seq(18, 2 * BS)
    ids = pool.allocate(2)
    register(pool, tokens, ids)
    pool.reset_prefix_cache()
    pool.free(ids[::-1])  # no hash any more: to the front
    assert sorted(pool.allocate(2)) == sorted(ids)


@pytest.mark.parametrize("seed", range(3))
def test_null_block_is_never_handed_out_under_churn(seed):
    rng = random.Random(seed)
    pool = BlockPool(rng.randint(2, 24))
    held: list[list[int]] = []
    for step in range(1500):
        if held and rng.random() < 0.4:
            group = held.pop(rng.randrange(len(held)))
            pool.free(group[::-1])
        elif rng.random() < 0.3 and held:  # share a held group's blocks (a prefix hit)
            group = rng.choice(held)
            pool.touch(group)
            held.append(list(group))
        else:
            n = rng.randint(0, 4)
            if pool.can_allocate(n):
                group = pool.allocate(n)
                assert NULL_BLOCK_ID not in group
                if rng.random() < 0.5:  # give some of them content
                    register(pool, seq(rng.randrange(6), len(group) * BS), group)
                held.append(group)
        if rng.random() < 0.01:
            pool.reset_prefix_cache()
        counts = [0] * pool.num_blocks
        for group in held:
            for b in group:
                counts[b] += 1
        assert counts[NULL_BLOCK_ID] == 0 and pool.ref_counts[NULL_BLOCK_ID] == 0
        assert pool.ref_counts == counts
        assert pool.num_free_blocks == sum(1 for b in range(1, pool.num_blocks) if counts[b] == 0)
    for group in held:
        pool.free(group[::-1])
    assert pool.num_free_blocks == pool.num_usable_blocks
    everything = pool.allocate(pool.num_usable_blocks)
    assert sorted(everything) == list(range(1, pool.num_blocks))
