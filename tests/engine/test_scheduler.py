"""Scheduler driven by a fake model loop (no model): batching limits, block accounting,
continuous batching, chunked prefill, preemption and recompute.

The loop (scheduler_loop.py) checks the invariants after every step; generated token k of every
request is FAKE_TOKEN + k, so lost or duplicated tokens show.
"""
from __future__ import annotations

import random

import pytest

from fastdeploy.engine.request import RequestStatus
from scheduler_loop import FAKE_TOKEN, FakeLoop, ceil_div, make_request


# ---------------------------------------------------------------------------------------------
def test_first_step_schedules_whole_prompts_and_allocates_blocks():
    loop = FakeLoop(num_blocks=50, block_size=4, max_num_seqs=8, max_num_batched_tokens=100, chunked=False)
    a, b, c = loop.add(make_request("a", 5, 3)), loop.add(make_request("b", 8, 3)), loop.add(make_request("c", 1, 3))
    assert loop.step() == [("a", 5), ("b", 8), ("c", 1)]
    assert [len(r.block_ids) for r in (a, b, c)] == [2, 2, 1]
    assert loop.pool.num_free_blocks == 49 - 5
    assert [len(r.output_token_ids) for r in (a, b, c)] == [1, 1, 1]
    assert loop.step() == [("a", 1), ("b", 1), ("c", 1)]
    # a: 6 tokens -> still 2 blocks; b: 9 tokens -> 3 blocks; c: 2 tokens -> 1 block
    assert [len(r.block_ids) for r in (a, b, c)] == [2, 3, 1]
    loop.run()
    assert len(loop.steps) == 3  # prefill + 2 decodes
    assert [r.request_id for r in loop.finished] == ["a", "b", "c"]


def test_at_most_max_num_seqs_run_and_queued_requests_join_as_others_finish():
    loop = FakeLoop(num_blocks=50, block_size=4, max_num_seqs=3, max_num_batched_tokens=100, chunked=False)
    loop.add(make_request("A", 5, 2))
    loop.add(make_request("B", 6, 5))
    loop.add(make_request("C", 7, 5))
    loop.add(make_request("D", 3, 2))
    assert loop.step() == [("A", 5), ("B", 6), ("C", 7)]  # D waits: 3 running
    assert loop.step() == [("A", 1), ("B", 1), ("C", 1)]  # A's 2nd token: A finishes
    assert loop.finish_step["A"] == 1
    # continuous batching: D joins while B and C are still decoding
    assert loop.step() == [("B", 1), ("C", 1), ("D", 3)]
    assert {"B", "C", "D"} == loop.running_log[2]
    assert loop.step() == [("B", 1), ("C", 1), ("D", 1)]
    assert loop.finish_step["D"] == 3
    assert loop.step() == [("B", 1), ("C", 1)]
    loop.run()
    assert len(loop.steps) == 5
    assert loop.finish_step == {"A": 1, "D": 3, "B": 4, "C": 4}


def test_many_requests_never_exceed_max_num_seqs():
    loop = FakeLoop(num_blocks=200, block_size=4, max_num_seqs=4, max_num_batched_tokens=1000, chunked=False)
    for i in range(20):
        loop.add(make_request(i, 3 + i % 5, 1 + (i * 7) % 6))
    loop.run()
    assert max(len(s) for s in loop.running_log) == 4
    assert max(len(items) for items in loop.steps) == 4
    # someone joined while others were still running
    joined_mid_flight = [
        rid for rid, step in loop.first_step.items()
        if step > 0 and any(o != rid and loop.first_step[o] < step < loop.finish_step[o] for o in loop.first_step)
    ]
    assert joined_mid_flight


def test_token_budget_limits_prompts_per_step_without_chunked_prefill():
    loop = FakeLoop(num_blocks=50, block_size=4, max_num_seqs=8, max_num_batched_tokens=16, chunked=False)
    for rid in "ABC":
        loop.add(make_request(rid, 10, 4))
    assert loop.step() == [("A", 10)]  # B's 10 tokens do not fit the 6 left
    assert loop.step() == [("A", 1), ("B", 10)]  # 11 <= 16; C's 10 > 5 left
    assert loop.step() == [("A", 1), ("B", 1), ("C", 10)]
    assert loop.step() == [("A", 1), ("B", 1), ("C", 1)]  # A's 4th token
    loop.run()
    assert all(sum(n for _, n in items) <= 16 for items in loop.steps)


def test_prompt_is_never_split_and_queue_is_fifo_without_chunked_prefill():
    loop = FakeLoop(num_blocks=50, block_size=4, max_num_seqs=8, max_num_batched_tokens=20, chunked=False)
    loop.add(make_request("A", 4, 3))
    loop.add(make_request("B", 20, 2))  # needs the whole budget for itself
    loop.add(make_request("C", 2, 2))  # small, but queued behind B
    assert loop.step() == [("A", 4)]
    assert loop.step() == [("A", 1)]  # A decodes: 19 left < 20, so B waits, and C behind it
    assert loop.step() == [("A", 1)]  # A finishes
    assert loop.step() == [("B", 20)]  # whole prompt in one step; C's 2 would exceed the budget
    assert loop.step() == [("B", 1), ("C", 2)]
    loop.run()
    assert loop.first_step == {"A": 0, "B": 3, "C": 4}


def test_long_prompt_alone_is_split_into_budget_sized_chunks():
    loop = FakeLoop(num_blocks=50, block_size=4, max_num_seqs=8, max_num_batched_tokens=16, chunked=True)
    r = loop.add(make_request("L", 50, 3))
    assert loop.step() == [("L", 16)]
    assert (r.num_computed_tokens, len(r.block_ids), r.output_token_ids) == (16, 4, [])
    assert loop.step() == [("L", 16)]
    assert loop.step() == [("L", 16)]
    assert (r.num_computed_tokens, len(r.block_ids), r.output_token_ids) == (48, 12, [])
    assert loop.step() == [("L", 2)]  # last chunk: the first token comes out
    assert (r.num_computed_tokens, len(r.block_ids), len(r.output_token_ids)) == (50, 13, 1)
    loop.run()
    assert loop.steps[4:] == [[("L", 1)], [("L", 1)]]


def test_chunks_share_steps_with_decodes_of_running_requests():
    loop = FakeLoop(num_blocks=50, block_size=4, max_num_seqs=8, max_num_batched_tokens=8, chunked=True)
    a = loop.add(make_request("A", 3, 10))
    b = loop.add(make_request("B", 20, 2))
    assert loop.step() == [("A", 3), ("B", 5)]
    assert (b.num_computed_tokens, len(b.block_ids), b.output_token_ids) == (5, 2, [])
    assert loop.step() == [("A", 1), ("B", 7)]  # A decodes in the same step as B's chunk
    assert (b.num_computed_tokens, len(b.block_ids)) == (12, 3)
    assert loop.step() == [("A", 1), ("B", 7)]
    assert (b.num_computed_tokens, len(b.block_ids)) == (19, 5)
    assert loop.step() == [("A", 1), ("B", 1)]  # B's last prompt token: its first output
    assert (b.num_computed_tokens, len(b.block_ids), len(b.output_token_ids)) == (20, 5, 1)
    assert len(a.output_token_ids) == 4
    assert loop.step() == [("A", 1), ("B", 1)]
    assert loop.finish_step["B"] == 4
    loop.run()
    assert len(loop.steps) == 10  # A: prefill + 9 decodes, one per step
    assert loop.kinds[1] == loop.kinds[2] == {"chunk", "decode"}


def test_chunked_prefill_admits_new_prompts_with_leftover_budget():
    loop = FakeLoop(num_blocks=50, block_size=4, max_num_seqs=8, max_num_batched_tokens=10, chunked=True)
    loop.add(make_request("A", 6, 3))
    loop.add(make_request("B", 7, 3))
    loop.add(make_request("C", 2, 3))
    assert loop.step() == [("A", 6), ("B", 4)]  # B starts with what is left
    assert loop.step() == [("A", 1), ("B", 3), ("C", 2)]
    assert loop.step() == [("A", 1), ("B", 1), ("C", 1)]
    loop.run()


def test_preemption_recomputes_the_latest_request_when_the_pool_is_full():
    # 4 usable blocks of 4 tokens; each request reaches 11 computed tokens = 3 blocks: both cannot fit
    loop = FakeLoop(num_blocks=5, block_size=4, max_num_seqs=8, max_num_batched_tokens=100, chunked=False)
    a = loop.add(make_request("A", 4, 8))
    b = loop.add(make_request("B", 4, 8))
    assert loop.step() == [("A", 4), ("B", 4)]
    assert loop.pool.num_free_blocks == 2
    assert loop.step() == [("A", 1), ("B", 1)]  # 5 tokens each: 2 blocks each, pool empty
    assert loop.pool.num_free_blocks == 0
    for _ in range(3):  # tokens 6..8 fit in the 2 blocks
        assert loop.step() == [("A", 1), ("B", 1)]
    assert (len(a.output_token_ids), len(b.output_token_ids)) == (5, 5)
    sched_out_step = len(loop.steps)
    assert loop.step() == [("A", 1)]  # A needs a 3rd block: B (admitted last) is preempted
    assert b.num_preemptions == 1 and a.num_preemptions == 0
    assert list(loop.sched.waiting) == [b] and b.output_token_ids == [FAKE_TOKEN + k for k in range(5)]
    assert loop.running_log[sched_out_step] == {"A"}
    assert loop.step() == [("A", 1)]  # B's 9 tokens need 3 blocks, 1 is free
    assert loop.step() == [("A", 1)]  # A's 8th token: A finishes
    assert loop.finish_step["A"] == 7
    assert loop.step() == [("B", 9)]  # recompute prompt + the 5 generated tokens at once
    assert len(b.output_token_ids) == 6
    assert loop.step() == [("B", 1)]
    assert loop.step() == [("B", 1)]
    assert loop.finish_step["B"] == 10
    loop.run()
    assert b.num_preemptions == 1


def test_preemption_with_chunked_prefill_completes_every_request():
    loop = FakeLoop(num_blocks=7, block_size=4, max_num_seqs=4, max_num_batched_tokens=6, chunked=True)
    for i in range(6):
        loop.add(make_request(i, 5 + 2 * i % 7, 6 + i % 4))
    loop.run()
    assert sum(r.num_preemptions for r in loop.requests) > 0


def test_finish_of_a_waiting_or_running_request_releases_it():
    loop = FakeLoop(num_blocks=20, block_size=4, max_num_seqs=1, max_num_batched_tokens=100, chunked=False)
    a = loop.add(make_request("A", 9, 5))
    b = loop.add(make_request("B", 3, 5))
    loop.step()
    assert len(a.block_ids) == 3 and loop.pool.num_free_blocks == 16
    loop.sched.finish_requests([b.request_id])  # abort while queued
    assert b.status == RequestStatus.FINISHED and b not in loop.sched.waiting
    loop.sched.finish_requests([a.request_id])  # abort while running
    assert a.status == RequestStatus.FINISHED and a.block_ids == []
    assert not loop.sched.has_unfinished()
    assert loop.pool.num_free_blocks == loop.pool.num_usable_blocks


# ---------------------------------------------------------------------------------------------
CONFIGS = [
    # block_size, max_num_seqs, budget, chunked, max_prompt, max_out, usable blocks (0: fit one request)
    (4, 8, 64, False, 40, 24, 0),
    (16, 16, 128, False, 60, 40, 0),
    (1, 6, 80, False, 30, 30, 0),
    (4, 8, 16, True, 40, 24, 0),
    (8, 32, 24, True, 90, 30, 0),
    (4, 4, 7, True, 25, 20, 30),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("config", CONFIGS, ids=[f"cfg{i}" for i in range(len(CONFIGS))])
def test_random_workload_keeps_every_invariant(config, seed):
    block_size, max_num_seqs, budget, chunked, max_prompt, max_out, usable = config
    rng = random.Random(1000 * seed + CONFIGS.index(config))
    longest = max_prompt + max_out - 1  # most tokens a request ever has computed
    one_request = ceil_div(longest, block_size)
    num_blocks = 1 + max(usable, one_request + rng.randint(0, one_request))  # small: forces preemption
    loop = FakeLoop(num_blocks, block_size, max_num_seqs, budget, chunked)
    num_requests = 300
    pending = [make_request(i, rng.randint(1, max_prompt), rng.randint(1, max_out)) for i in range(num_requests)]
    pending.reverse()
    for _ in range(rng.randint(1, 40)):  # some arrive up front, the rest while the engine runs
        loop.add(pending.pop())
    while pending or loop.sched.has_unfinished():
        for _ in range(rng.choice([0, 0, 0, 1, 1, 2, 5])):
            if pending:
                loop.add(pending.pop())
        if loop.sched.has_unfinished():
            loop.step()
        assert len(loop.steps) < 200_000
    loop.check_done()
    assert len(loop.finished) == num_requests
    assert sum(r.num_preemptions for r in loop.requests) > 0, "pool was meant to be small enough to preempt"
    assert max(len(s) for s in loop.running_log) <= max_num_seqs
    if chunked:  # long prompts were chunked, and chunks shared steps with decodes
        assert any(k == {"chunk", "decode"} for k in loop.kinds)
