"""KVCacheManager without a scheduler or a model: allocation and growth of block tables, release,
prefix hits (tokens and parent key confirmed), the step's rollback, the reference-count invariant,
and the seams for lookahead slots (speculative decoding) and prefill-only requests (pooling).

Oracles: block counts are ceil(tokens / block_size) computed here; reference counts are counted
from the block tables themselves; hit lengths follow from which prompts share which whole blocks.
"""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from fastdeploy.cache_manager import kv_cache_manager as manager_module
from fastdeploy.cache_manager.block_pool import NULL_BLOCK_ID, BlockPool, hash_block
from fastdeploy.cache_manager.kv_cache_manager import KVCacheManager
from fastdeploy.engine.request import Request
from fastdeploy.engine.sampling_params import SamplingParams

BS = 4


def request(request_id: str, tokens: list[int], prompt_logprobs=None) -> Request:
    return Request(request_id=request_id, prompt_token_ids=list(tokens),
                   sampling_params=SamplingParams(max_tokens=4, prompt_logprobs=prompt_logprobs),
                   positions=np.arange(len(tokens), dtype=np.int64))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def admit(manager: KVCacheManager, r: Request, num_new: int = None):
    """Admission as the scheduler does it: prefix hit, blocks for the rest, its full blocks registered."""
    prefix = manager.get_computed_blocks(r)
    num_new = r.num_tokens - prefix.num_tokens if num_new is None else num_new
    added = manager.allocate_slots(r, num_new, prefix)
    if added is not None:
        r.num_computed_tokens = prefix.num_tokens
        manager.cache_blocks(r, prefix.num_tokens + num_new)
    return prefix, added


def prefilled(manager: KVCacheManager, r: Request) -> Request:
    """`r` admitted and its whole prompt computed (the step ran)."""
    admit(manager, r)
    r.num_computed_tokens = r.num_tokens
    return r


def check_ref_counts(pool: BlockPool, tables: list[list[int]]) -> None:
    holders = Counter(b for table in tables for b in table)
    for block_id in range(1, pool.num_blocks):
        assert pool.ref_counts[block_id] == holders[block_id], f"block {block_id}"
    assert pool.num_free_blocks == pool.num_usable_blocks - len(holders)
    assert NULL_BLOCK_ID not in holders


# ---- allocation, growth, release --------------------------------------------------------------------
def test_allocation_growth_and_free_accounting():
    pool = BlockPool(11)  # 10 usable
    manager = KVCacheManager(pool, BS, enable_caching=False)
    r = request("r", range(10))
    prefix, added = admit(manager, r)
    assert prefix.num_tokens == 0 and prefix.block_ids == []
    assert added == r.block_ids and len(r.block_ids) == ceil_div(10, BS) == 3
    assert pool.num_free_blocks == 10 - 3
    r.num_computed_tokens = 10
    assert manager.allocate_slots(r, 2) == [] and len(r.block_ids) == 3  # 12 tokens still fit 3 blocks
    grown = manager.allocate_slots(r, 3)  # 13 tokens: a fourth block
    assert len(grown) == 1 and r.block_ids[3:] == grown and pool.num_free_blocks == 6
    assert manager.num_tokens_fitting(r) == (4 + 6) * BS
    manager.free(r)
    assert r.block_ids == [] and pool.num_free_blocks == pool.num_usable_blocks
    assert all(c == 0 for c in pool.ref_counts)


def test_allocate_slots_returns_none_and_changes_nothing_when_the_pool_is_short():
    pool = BlockPool(4)  # 3 usable
    manager = KVCacheManager(pool, BS)
    a = prefilled(manager, request("a", range(8)))  # 2 blocks
    before = (list(a.block_ids), list(pool.ref_counts), pool.num_free_blocks)
    assert manager.allocate_slots(a, 5) is None  # 13 tokens: 4 blocks, only 3 exist
    assert (a.block_ids, pool.ref_counts, pool.num_free_blocks) == before
    b = request("b", range(100, 109))
    assert manager.get_computed_blocks(b).num_tokens == 0
    assert manager.allocate_slots(b, 9, manager.get_computed_blocks(b)) is None and b.block_ids == []


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(BlockPool(4), 0)
    manager = KVCacheManager(BlockPool(4), BS)
    with pytest.raises(ValueError, match="num_lookahead_tokens"):
        manager.allocate_slots(request("r", [1, 2]), 1, num_lookahead_tokens=-1)


# ---- prefix hits ------------------------------------------------------------------------------------
def test_prefix_hit_takes_whole_cached_blocks_and_leaves_one_token_to_compute():
    pool = BlockPool(20)
    manager = KVCacheManager(pool, BS)
    shared = list(range(100, 108))  # two whole blocks
    a = request("a", shared + [1, 2, 3, 4, 5])
    admit(manager, a)
    assert pool.num_cached_blocks == 3  # a's three whole blocks
    b = request("b", shared + [9])
    prefix, _ = admit(manager, b)
    assert prefix.block_ids == a.block_ids[:2] and prefix.num_tokens == 8
    assert b.block_ids[:2] == a.block_ids[:2] and [pool.ref_counts[x] for x in a.block_ids[:2]] == [2, 2]
    exact = request("exact", shared)  # the whole prompt cached: the last block is computed again
    assert manager.get_computed_blocks(exact).num_tokens == 4
    scoring = request("scoring", shared + [9], prompt_logprobs=1)  # its prompt's logits must be computed
    assert manager.get_computed_blocks(scoring).num_tokens == 0
    assert KVCacheManager(pool, BS, enable_caching=False).get_computed_blocks(b).num_tokens == 0


def test_freed_blocks_stay_cached_until_reused():
    pool = BlockPool(20)
    manager = KVCacheManager(pool, BS)
    a = request("a", range(9))
    admit(manager, a)
    cached = list(a.block_ids[:2])
    manager.free(a)
    assert pool.num_free_blocks == pool.num_usable_blocks and pool.num_cached_blocks == 2
    b = request("b", range(9))
    prefix, _ = admit(manager, b)
    assert prefix.block_ids == cached and pool.num_free_blocks == pool.num_usable_blocks - 3


def test_a_hit_confirms_the_parent_key_not_only_the_hash(monkeypatch):
    """Keys that ignore the parent (forced): A = T1 + U is cached, B = T2 + U caches T2 (its U is
    refused: the key is A's U, whose parent is T1's). C = T2 + U + x then hits B's T2 but not A's U,
    whose KV was computed after T1."""
    monkeypatch.setattr(manager_module, "hash_block", lambda parent, tokens, extra=(): hash_block(None, tokens, extra))
    pool = BlockPool(20)
    manager = KVCacheManager(pool, BS)
    t1, t2, u = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    a, b = request("a", t1 + u), request("b", t2 + u)
    admit(manager, a)
    admit(manager, b)
    assert b.prefix_chain_broken and len(b.block_hashes) == 1
    c = request("c", t2 + u + [0])
    prefix = manager.get_computed_blocks(c)
    assert prefix.block_ids == b.block_ids[:1] and prefix.num_tokens == BS


def test_images_tell_blocks_with_the_same_placeholder_tokens_apart():
    from fastdeploy.multimodal.inputs import MultiModalFeature

    def with_image(rid: str, mm_hash: str) -> Request:
        r = request(rid, [7] * 9)
        r.mm_features = [MultiModalFeature("image", offset=2, length=4, pixel_values=np.zeros((0, 1), np.float32),
                                           grid_thw=(1, 1, 1), mm_hash=mm_hash)]
        return r

    manager = KVCacheManager(BlockPool(20), BS)
    admit(manager, with_image("a", "cat"))
    assert manager.get_computed_blocks(with_image("b", "cat")).num_tokens == 8
    assert manager.get_computed_blocks(with_image("c", "dog")).num_tokens == 0  # block 0 overlaps the image


# ---- the step's rollback ----------------------------------------------------------------------------
def test_rollback_forgets_registered_blocks_and_frees_growth_but_not_admissions():
    pool = BlockPool(20)
    manager = KVCacheManager(pool, BS)
    running = prefilled(manager, request("running", range(7)))
    manager.commit_step()  # that step ran
    cached_before, held_before = pool.num_cached_blocks, list(running.block_ids)
    manager.begin_step()
    manager.allocate_slots(running, 2)  # 9 tokens: a third block
    manager.cache_blocks(running, 9)  # completes block 1
    admitted = request("admitted", range(50, 60))
    admit(manager, admitted)
    assert pool.num_cached_blocks == cached_before + 1 + 2 and len(running.block_ids) == 3
    manager.rollback_step()
    assert pool.num_cached_blocks == cached_before, "blocks without KV stayed in the prefix cache"
    assert running.block_ids == held_before and len(running.block_hashes) == 1
    assert admitted.block_hashes == [] and len(admitted.block_ids) == 3  # the scheduler frees it as it requeues
    check_ref_counts(pool, [running.block_ids, admitted.block_ids])
    manager.free(admitted)
    manager.free(running)
    assert pool.num_free_blocks == pool.num_usable_blocks


def test_commit_leaves_nothing_to_roll_back():
    pool = BlockPool(20)
    manager = KVCacheManager(pool, BS)
    manager.begin_step()
    r = request("r", range(9))
    admit(manager, r)
    manager.commit_step()
    manager.rollback_step()
    assert pool.num_cached_blocks == 2 and len(r.block_hashes) == 2


@pytest.mark.parametrize("seed", range(20))
def test_reference_counts_equal_the_block_tables_holding_each_block(seed):
    rng = random.Random(seed)
    pool = BlockPool(rng.randint(4, 30))
    manager = KVCacheManager(pool, rng.choice([1, 2, 4]), enable_caching=rng.random() < 0.8)
    prompts = [[rng.randrange(3) for _ in range(40)] for _ in range(3)]  # few symbols: many shared blocks
    live: list[Request] = []
    for i in range(200):
        op = rng.random()
        if op < 0.35:
            r = request(f"r{i}", rng.choice(prompts)[: rng.randint(1, 40)])
            if admit(manager, r, None)[1] is not None:
                live.append(r)
        elif op < 0.6 and live:
            r = rng.choice(live)
            r.num_computed_tokens = len(r.block_ids) * manager.block_size
            r.output_token_ids.extend(rng.randrange(3) for _ in range(rng.randint(1, 5)))
            num_new = r.num_tokens - r.num_computed_tokens
            if num_new > 0 and manager.allocate_slots(r, num_new) is not None:
                manager.cache_blocks(r, r.num_tokens)
        elif op < 0.8 and live:
            manager.free(live.pop(rng.randrange(len(live))))
        elif op < 0.9:
            manager.rollback_step()
        else:
            manager.begin_step()
        check_ref_counts(pool, [r.block_ids for r in live])
    for r in live:
        manager.free(r)
    check_ref_counts(pool, [])


# ---- seams: lookahead slots and prefill-only requests ---------------------------------------------
def test_lookahead_tokens_reserve_slots_beyond_the_new_tokens():
    pool = BlockPool(11)
    manager = KVCacheManager(pool, BS)
    r = prefilled(manager, request("r", range(7)))
    added = manager.allocate_slots(r, 1, num_lookahead_tokens=3)  # 7 + 1 + 3 = 11 slots: 3 blocks
    assert len(r.block_ids) == ceil_div(11, BS) == 3 and len(added) == 1
    manager.cache_blocks(r, 8)  # only computed tokens are registered, never lookahead slots
    assert len(r.block_hashes) == 2
    too_many = pool.num_usable_blocks * BS  # with the 8 tokens held: more blocks than the pool has
    assert manager.allocate_slots(r, 1, num_lookahead_tokens=too_many) is None and len(r.block_ids) == 3


def test_a_prefill_only_request_holds_exactly_its_prompt_and_leaves_it_cached():
    pool = BlockPool(11)
    manager = KVCacheManager(pool, BS)
    prompt = list(range(12))
    r = request("pooled", prompt)
    admit(manager, r)
    assert len(r.block_ids) == ceil_div(len(prompt), BS)  # no slot for a generated token
    manager.free(r)  # done after its one prefill step
    again = request("again", prompt)
    assert manager.get_computed_blocks(again).num_tokens == (len(prompt) - 1) // BS * BS
    assert pool.num_free_blocks == pool.num_usable_blocks
