"""BlockPool accounting: block 0 is never handed out, allocate/free bookkeeping, reuse order, errors."""
import random

import pytest

from fastdeploy.cache_manager.block_pool import NULL_BLOCK_ID, BlockPool, hash_block


def test_null_block_is_never_handed_out():
    pool = BlockPool(8)
    assert pool.num_usable_blocks == 7
    assert pool.num_free_blocks == 7
    blocks = pool.allocate(7)
    assert NULL_BLOCK_ID == 0
    assert sorted(blocks) == [1, 2, 3, 4, 5, 6, 7]
    assert pool.num_free_blocks == 0
    assert not pool.can_allocate(1)
    with pytest.raises(RuntimeError, match="asked for 1 KV blocks, 0 free"):
        pool.allocate(1)


def test_smallest_pool_serves_one_block():
    pool = BlockPool(2)
    assert pool.num_usable_blocks == 1
    assert pool.allocate(1) == [1]


@pytest.mark.parametrize("num_blocks", [1, 0, -3])
def test_pool_needs_at_least_two_blocks(num_blocks):
    with pytest.raises(ValueError, match="num_blocks must be >= 2"):
        BlockPool(num_blocks)


def test_can_allocate_allocate_free_accounting():
    pool = BlockPool(11)  # 10 usable
    assert pool.can_allocate(0) and pool.can_allocate(10) and not pool.can_allocate(11)
    assert pool.allocate(0) == []
    a = pool.allocate(3)
    assert len(a) == 3 and len(set(a)) == 3
    assert pool.num_free_blocks == 7
    assert pool.can_allocate(7) and not pool.can_allocate(8)
    b = pool.allocate(7)
    assert set(a).isdisjoint(b)
    assert set(a) | set(b) == set(range(1, 11))
    assert pool.num_free_blocks == 0
    pool.free(a[:2])
    assert pool.num_free_blocks == 2
    assert pool.can_allocate(2) and not pool.can_allocate(3)
    pool.free(b)
    pool.free(a[2:])
    assert pool.num_free_blocks == pool.num_usable_blocks == 10


def test_allocating_more_than_free_raises_and_changes_nothing():
    pool = BlockPool(6)  # 5 usable
    held = pool.allocate(2)
    with pytest.raises(RuntimeError, match="asked for 4 KV blocks, 3 free"):
        pool.allocate(4)
    assert pool.num_free_blocks == 3  # no half-done allocation
    rest = pool.allocate(3)
    assert set(held) | set(rest) == {1, 2, 3, 4, 5}


def test_double_free_raises():
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    pool.free(blocks)
    with pytest.raises(RuntimeError, match=f"KV block {blocks[0]} freed but not in use"):
        pool.free([blocks[0]])
    assert pool.num_free_blocks == 3


def test_freeing_a_block_never_allocated_raises():
    pool = BlockPool(4)
    with pytest.raises(RuntimeError, match="KV block 2 freed but not in use"):
        pool.free([2])
    pool.allocate(3)
    with pytest.raises(RuntimeError, match="KV block 0 freed but not in use"):
        pool.free([NULL_BLOCK_ID])
    with pytest.raises(RuntimeError, match="KV block 99 freed but not in use"):
        pool.free([99])
    assert pool.num_free_blocks == 0


def test_uncached_freed_blocks_are_reused_first_and_cached_ones_last():
    pool = BlockPool(8)
    assert pool.allocate(3) == [1, 2, 3]
    pool.free([2])  # holds nothing worth keeping: goes to the front
    assert pool.allocate(2) == [2, 4]
    pool.cache_block(1, hash_block(None, (9, 9)), (9, 9), None)
    pool.free([3, 1])  # 3 to the front, cached 1 to the back: evicted last
    assert pool.allocate(4) == [3, 5, 6, 7]
    assert pool.lookup(hash_block(None, (9, 9)), (9, 9), None) == 1  # still cached while free
    assert pool.allocate(1) == [1]
    assert pool.lookup(hash_block(None, (9, 9)), (9, 9), None) is None  # handed out: evicted


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_allocate_free_matches_a_model(seed):
    rng = random.Random(seed)
    pool = BlockPool(rng.randint(2, 40))
    held: list[list[int]] = []
    for _ in range(2000):
        in_use = [b for group in held for b in group]
        assert pool.num_free_blocks + len(in_use) == pool.num_usable_blocks
        assert len(set(in_use)) == len(in_use)
        assert all(1 <= b < pool.num_blocks for b in in_use)
        if held and rng.random() < 0.45:
            pool.free(held.pop(rng.randrange(len(held))))
            continue
        n = rng.randint(0, 6)
        if pool.can_allocate(n):
            assert n <= pool.num_free_blocks
            held.append(pool.allocate(n))
        else:
            assert n > pool.num_free_blocks
            with pytest.raises(RuntimeError):
                pool.allocate(n)
    for group in held:
        pool.free(group)
    assert pool.num_free_blocks == pool.num_usable_blocks
    assert sorted(pool.allocate(pool.num_usable_blocks)) == list(range(1, pool.num_blocks))
