"""Scheduler with prefix caching, driven by a fake model loop (no model): random workloads with
shared prefixes, preemption, aborts and cache resets keep every block accounted for; a prefix-cache
hit always serves the KV of the very same prefix; `long_prefill_token_threshold` lets short prompts
in beside a long one; decodes are never left out for a prefill. The loop and its simulated KV
cache: prefix_loop.py.
"""
from __future__ import annotations

import random

import pytest

from fastdeploy.cache_manager import kv_cache_manager
from fastdeploy.engine.request import RequestStatus
from prefix_loop import PrefixLoop, ceil_div, make_request


# ---- random workloads ----------------------------------------------------------------------------
CONFIGS = [
    # block_size, max_num_seqs, budget, chunked, threshold, max_prompt, max_out
    (4, 8, 64, False, 0, 40, 20),
    (8, 16, 48, True, 12, 70, 20),
    (16, 12, 32, True, 0, 90, 24),
    (2, 6, 40, False, 0, 25, 12),
    (4, 10, 10, True, 3, 50, 16),
]


def random_workload(rng: random.Random, n: int, max_prompt: int, max_out: int) -> list[tuple[list[int], int]]:
    """Prompts: some behind one of a few shared long prefixes, some exact duplicates, some unrelated."""
    prefixes = [[rng.randrange(5000) for _ in range(rng.randint(max_prompt // 3, max_prompt - 2))] for _ in range(4)]
    work = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.45:
            prefix = rng.choice(prefixes)
            prompt = prefix + [rng.randrange(5000) for _ in range(rng.randint(0, max_prompt - len(prefix)))]
        elif kind < 0.6 and work:
            prompt = list(rng.choice(work)[0])
        else:
            prompt = [rng.randrange(5000) for _ in range(rng.randint(1, max_prompt))]
        work.append((prompt or [1], rng.randint(1, max_out)))
    return work


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("config", CONFIGS, ids=[f"cfg{i}" for i in range(len(CONFIGS))])
def test_random_workload_with_prefix_caching_keeps_every_invariant(config, seed):
    block_size, max_num_seqs, budget, chunked, threshold, max_prompt, max_out = config
    rng = random.Random(100 * seed + CONFIGS.index(config))
    one_request = ceil_div(max_prompt + max_out - 1, block_size)  # most blocks one request holds
    num_blocks = 1 + one_request + rng.randint(0, one_request)  # small: forces preemption
    loop = PrefixLoop(num_blocks, block_size, max_num_seqs, budget, chunked, threshold)
    pending = [make_request(i, p, m) for i, (p, m) in enumerate(random_workload(rng, 500, max_prompt, max_out))]
    pending.reverse()
    resets = 0
    while pending or loop.sched.has_unfinished():
        for _ in range(rng.choice([0, 0, 1, 1, 2, 4])):
            if pending:
                loop.add(pending.pop())
        if rng.random() < 0.03:  # abort a random unfinished request, queued or running
            candidates = list(loop.sched.waiting) + loop.sched.running
            if candidates:
                loop.abort(rng.choice(candidates))
        if rng.random() < 0.005:
            loop.pool.reset_prefix_cache()
            resets += 1
        if loop.sched.has_unfinished():
            loop.step()
        assert len(loop.steps) < 100_000
    loop.check_done()
    assert len(loop.finished) + len(loop.aborted) == 500
    assert loop.aborted and loop.finished
    assert loop.num_preempted > 0, "the pool was meant to be small enough to preempt"
    hits = [c for _, c in loop.admissions if c > 0]
    assert len(hits) > 20, "shared prefixes were meant to hit the cache"
    assert loop.max_ref_count >= 2, "blocks were meant to be shared by running requests"
    assert not loop.empty_steps, f"steps {loop.empty_steps[:5]} scheduled nothing although requests were running"
    # the reported hit is the first admission's
    for r in loop.requests:
        if r.num_cached_tokens is not None:
            assert r.num_cached_tokens % block_size == 0 and r.num_cached_tokens < r.num_prompt_tokens


def test_a_hit_leaves_at_least_one_token_to_compute():
    bs = 8
    loop = PrefixLoop(num_blocks=40, block_size=bs, max_num_seqs=8, budget=200, chunked=False)
    prompt = [(5 * i + 1) % 97 for i in range(4 * bs)]  # an exact multiple of the block size
    first = loop.add(make_request("first", prompt, 2))
    loop.step()
    assert first.num_cached_tokens == 0
    again = loop.add(make_request("again", prompt, 2))
    assert loop.step() == [("first", 1), ("again", bs)]  # 3 blocks from the cache, the 4th computed
    assert again.num_cached_tokens == 3 * bs
    longer = loop.add(make_request("longer", prompt + [3], 2))
    shorter = loop.add(make_request("shorter", prompt[: 2 * bs + 3], 2))
    one = loop.add(make_request("one", prompt[:1], 2))
    loop.step()
    assert longer.num_cached_tokens == 4 * bs  # all 4 prompt blocks, 1 token computed
    assert shorter.num_cached_tokens == 2 * bs
    assert one.num_cached_tokens == 0
    while loop.sched.has_unfinished():
        loop.step()
    loop.check_done()


def test_requests_admitted_in_the_same_step_share_the_blocks_it_computes():
    bs = 4
    loop = PrefixLoop(num_blocks=40, block_size=bs, max_num_seqs=8, budget=200, chunked=False)
    prefix = list(range(100, 100 + 5 * bs))
    a = loop.add(make_request("a", prefix + [1, 2], 3))
    b = loop.add(make_request("b", prefix + [3], 3))
    c = loop.add(make_request("c", prefix + [4, 5, 6], 3))
    assert loop.step() == [("a", 5 * bs + 2), ("b", 1), ("c", 3)]
    assert (a.num_cached_tokens, b.num_cached_tokens, c.num_cached_tokens) == (0, 5 * bs, 5 * bs)
    assert b.block_ids[:5] == a.block_ids[:5] == c.block_ids[:5]
    assert [loop.pool.ref_counts[x] for x in a.block_ids[:5]] == [3] * 5
    while loop.sched.has_unfinished():
        loop.step()
    loop.check_done()


def test_preempted_request_finds_its_own_blocks_again():
    bs = 4
    # 6 usable blocks: two requests of 4 + 12 tokens cannot both hold 4 blocks
    loop = PrefixLoop(num_blocks=7, block_size=bs, max_num_seqs=4, budget=100, chunked=False)
    loop.add(make_request("a", list(range(10, 18)), 12))
    b = loop.add(make_request("b", list(range(30, 38)), 12))
    while b.num_preemptions == 0:
        loop.step()
    readmitted = None
    while loop.sched.has_unfinished():
        loop.step()
        if readmitted is None and b.status == RequestStatus.RUNNING:
            readmitted = [c for r, c in loop.admissions if r is b][-1]
    loop.check_done()
    assert b.num_cached_tokens == 0  # reported: its first admission
    assert readmitted is not None and readmitted > 0 and readmitted % bs == 0


def test_abort_of_requests_sharing_cached_blocks_frees_everything():
    bs = 4
    loop = PrefixLoop(num_blocks=30, block_size=bs, max_num_seqs=8, budget=100, chunked=False)
    prefix = list(range(200, 200 + 4 * bs))
    reqs = [loop.add(make_request(i, prefix + [i, i + 1], 10)) for i in range(4)]
    loop.step()
    loop.step()
    assert loop.pool.ref_counts[reqs[0].block_ids[0]] == 4
    for r in reqs[::-1][:2] + reqs[:2]:  # any order
        loop.abort(r)
    loop.check_done()
    # the shared prefix is still cached, and free: a new request finds it
    late = loop.add(make_request("late", prefix + [7], 2))
    loop.step()
    assert late.num_cached_tokens == 4 * bs
    while loop.sched.has_unfinished():
        loop.step()
    loop.check_done()


def test_hash_collision_on_a_parent_block_never_serves_another_prefix(monkeypatch):
    """Force every first block to hash alike. Sequence B = T2 + U is cached after A = T1 + V, so
    B's first block (T2) is not registered (T1 holds the hash), but B's second block (U) is, with
    the colliding hash as its parent. C = T1 + U must not get B's second block: its KV was computed
    after T2, not after T1."""
    real = kv_cache_manager.hash_block

    def colliding(parent, tokens, extra_keys=()):
        return b"colliding key" if parent is None else real(parent, tokens, extra_keys)

    monkeypatch.setattr(kv_cache_manager, "hash_block", colliding)
    bs = 4
    loop = PrefixLoop(num_blocks=30, block_size=bs, max_num_seqs=8, budget=100, chunked=False)
    t1, t2, u, v = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]
    loop.add(make_request("A", t1 + v + [0], 1))
    loop.step()
    loop.add(make_request("B", t2 + u + [0], 1))
    loop.step()
    c = loop.add(make_request("C", t1 + u + [0], 1))
    loop.step()  # the KV check raises if C reads B's block for its positions 4..7
    assert c.num_cached_tokens == bs  # only T1 is C's prefix in the cache
    loop.check_done()


# ---- chunked prefill and long_prefill_token_threshold ------------------------------------------------
def test_short_prompt_behind_a_long_one_joins_the_first_step():
    loop = PrefixLoop(num_blocks=100, block_size=4, max_num_seqs=8, budget=64, chunked=True, threshold=16)
    long = loop.add(make_request("L", list(range(1000, 1200)), 2))
    short = loop.add(make_request("S", [7, 8, 9, 10, 11], 2))
    items = dict(loop.step())
    assert items.get("S") == 5, "the short prompt waited for the long prefill"
    assert items["L"] == 64 - 5  # its threshold share, then the leftover budget
    assert sum(items.values()) == 64
    assert len(short.output_token_ids) == 1 and long.num_computed_tokens == 59
    # the short one decodes beside the long prefill, which takes the rest of each step
    items = dict(loop.step())
    assert items == {"L": 63, "S": 1}
    while loop.sched.has_unfinished():
        loop.step()
    loop.check_done()


def test_without_the_threshold_the_short_prompt_waits():
    """The contrast: threshold = budget, so the long prompt takes whole steps."""
    loop = PrefixLoop(num_blocks=100, block_size=4, max_num_seqs=8, budget=64, chunked=True, threshold=64)
    loop.add(make_request("L", list(range(1000, 1200)), 2))
    loop.add(make_request("S", [7, 8, 9, 10, 11], 2))
    assert loop.step() == [("L", 64)]


def test_short_prompt_joins_while_a_long_prompt_is_mid_prefill():
    loop = PrefixLoop(num_blocks=100, block_size=4, max_num_seqs=8, budget=32, chunked=True, threshold=8)
    loop.add(make_request("L", list(range(1000, 1200)), 2))
    assert loop.step() == [("L", 32)]  # alone: the whole budget
    assert loop.step() == [("L", 32)]
    loop.add(make_request("S", [7, 8, 9], 2))
    items = loop.step()
    assert dict(items) == {"L": 29, "S": 3}  # 8 for L, 3 for S, then L tops up to the budget
    while loop.sched.has_unfinished():
        loop.step()
    loop.check_done()


def test_long_prompt_alone_gets_the_whole_budget_every_step():
    budget, threshold, length = 48, 10, 300
    loop = PrefixLoop(num_blocks=100, block_size=8, max_num_seqs=8, budget=budget, chunked=True, threshold=threshold)
    loop.add(make_request("L", [(3 * i) % 4000 for i in range(length)], 3))
    while loop.sched.has_unfinished():
        loop.step()
    prefill = [items[0][1] for items in loop.steps[: ceil_div(length, budget)]]
    assert prefill == [budget] * (length // budget) + [length % budget]
    assert [items[0][1] for items in loop.steps[len(prefill):]] == [1, 1]
    loop.check_done()


def test_two_long_prompts_and_a_short_one_share_the_first_step():
    loop = PrefixLoop(num_blocks=200, block_size=4, max_num_seqs=8, budget=40, chunked=True, threshold=10)
    loop.add(make_request("L1", list(range(1000, 1150)), 2))
    loop.add(make_request("L2", list(range(2000, 2150)), 2))
    loop.add(make_request("S", [1, 2], 2))
    assert dict(loop.step()) == {"L1": 10 + 18, "L2": 10, "S": 2}
    while loop.sched.has_unfinished():
        loop.step()
    loop.check_done()


def test_a_decode_preempting_itself_does_not_stall_earlier_prefills():
    """3 usable blocks of 4 tokens, budget 6, threshold 2 (no leftover budget to top up). Steps 1-2
    give R0, R1, R2 two tokens each (one block each: the pool is full). In step 3 R2, now decoding and the latest admitted,
    needs a 2nd block: it is preempted, freeing its block. R0 (admitted first, 4 of 9 prompt tokens
    computed) can take its 2-token share with that block, so the step must not be empty."""
    loop = PrefixLoop(num_blocks=4, block_size=4, max_num_seqs=8, budget=6, chunked=True, threshold=2)
    loop.add(make_request("R0", list(range(1, 10)), 1))
    loop.add(make_request("R1", list(range(101, 110)), 3))
    r2 = loop.add(make_request("R2", list(range(201, 205)), 7))
    assert loop.step() == [("R0", 2), ("R1", 2), ("R2", 2)]
    assert loop.step() == [("R0", 2), ("R1", 2), ("R2", 2)]
    assert len(r2.output_token_ids) == 1 and loop.pool.num_free_blocks == 0
    items = dict(loop.step())
    assert r2.num_preemptions == 1
    assert items.get("R0", 0) >= 2, f"step 3 scheduled {items}: R0's prefill was left out with a free block"
    while loop.sched.has_unfinished():
        loop.step()
    loop.check_done()


@pytest.mark.parametrize("chunked,threshold", [(True, 4), (True, 0), (False, 0)])
def test_decodes_are_scheduled_every_step_beside_prefills(chunked, threshold):
    budget = 24 if chunked else 100
    loop = PrefixLoop(num_blocks=300, block_size=4, max_num_seqs=16, budget=budget, chunked=chunked,
                      threshold=threshold)
    decoders = [loop.add(make_request(f"d{i}", [i + 1, i + 2], 30)) for i in range(6)]
    loop.step()
    for k in range(8):  # long prompts keep arriving; every decoder gets its token in every step
        loop.add(make_request(f"p{k}", [(k * 7 + i) % 3000 for i in range(90)], 2))
        items = dict(loop.step())
        for d in decoders:
            assert items.get(d.request_id) == 1
        assert sum(items.values()) <= budget
    while loop.sched.has_unfinished():
        loop.step()
    loop.check_done()
