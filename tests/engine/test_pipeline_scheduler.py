"""The scheduler with steps in flight (pipeline parallelism's batch queue), driven by a fake model loop.

The loop keeps up to `depth` scheduled steps whose results have not been applied, as LLMEngine does
with `pipeline_parallel_size` = depth, and applies them oldest first. Checked after every schedule:
no request is in two steps in flight, a step holds at most 1/depth of the active requests, a request
in flight is never preempted, the runner's view of
each scheduled request (a pipeline stage before the last: what NewRequestData and the
CachedRequestData diffs with their `new_token_ids` tell it) equals the scheduler's tokens; at the
end every request has its max_tokens fake tokens in order and every block is free.
"""
from __future__ import annotations

import random
from collections import deque

import pytest

from fastdeploy.cache_manager.block_pool import BlockPool
from fastdeploy.cache_manager.kv_cache_manager import KVCacheManager
from fastdeploy.engine.request import RequestStatus
from fastdeploy.engine.sched.scheduler import Scheduler
from fastdeploy.worker.output import ModelRunnerOutput
from fake_model import apply_step, scheduled
from scheduler_loop import FAKE_TOKEN, make_request


class StageView:
    """A pipeline stage before the last: the tokens it knows of each request, from the diffs alone."""

    def __init__(self):
        self.tokens: dict[str, list[int]] = {}

    def apply(self, out) -> None:
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            self.tokens.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            self.tokens[new.req_id] = list(new.prompt_token_ids) + list(new.output_token_ids)
        for cached in out.scheduled_cached_reqs:
            self.tokens[cached.req_id] += cached.new_token_ids


def run_pipelined(seed: int, depth: int, chunked: bool, caching: bool, abort_rate: float) -> int:
    """A random workload through the scheduler with `depth` steps in flight; returns preemptions seen."""
    rng = random.Random(seed)
    pool = BlockPool(rng.randint(14, 30))
    sched = Scheduler(KVCacheManager(pool, 4, enable_caching=caching), max_num_seqs=rng.randint(2, 6),
                      max_num_batched_tokens=rng.randint(32, 48), enable_chunked_prefill=chunked,  # >= prompt + max_tokens
                      max_in_flight=depth)
    requests = [sched_add(sched, make_request(i, rng.randint(1, 24), rng.randint(1, 8))) for i in range(24)]
    view, in_flight, preempted = StageView(), deque(), []
    original_preempt = sched._preempt

    def preempt(request):
        assert request not in sched.in_flight, "a request in flight was preempted"
        preempted.append(request.request_id)
        original_preempt(request)

    sched._preempt = preempt
    for _ in range(5000):
        if not sched.has_unfinished() and not in_flight:
            break
        while len(in_flight) < depth:
            active = min(sched.max_num_seqs, len(sched.running) + len(sched.waiting))
            out = sched.schedule()
            if out.is_empty:
                break
            ids = set(out.num_scheduled_tokens)
            assert len(ids) <= -(-active // depth), "a step took more than its share of the requests"
            assert not any(ids & set(o.num_scheduled_tokens) for o in in_flight), "a request in two steps in flight"
            view.apply(out)
            for request, _ in scheduled(sched, out):
                assert view.tokens[request.request_id] == request.prompt_token_ids + request.output_token_ids
            in_flight.append(out)
        assert in_flight or not sched.has_unfinished(), "no step in flight and none scheduled"
        if in_flight:
            apply_oldest(sched, in_flight.popleft())
        if rng.random() < abort_rate and sched.running:  # an abort may hit a request in flight
            sched.finish_requests([rng.choice(sched.running).request_id])
    assert not sched.has_unfinished() and not in_flight and not sched.in_flight
    assert pool.num_free_blocks == pool.num_usable_blocks
    for request in requests:
        assert request.status == RequestStatus.FINISHED and request.block_ids == []
        done = request.output_token_ids
        assert done == [FAKE_TOKEN + k for k in range(len(done))]
        assert len(done) <= request.sampling_params.max_tokens
    return len(preempted)


def apply_oldest(sched: Scheduler, out) -> None:
    """fake_model.apply_step for a step whose requests may have been aborted while it was in flight."""
    sampled = {req_id: [FAKE_TOKEN + len(sched.requests[req_id].output_token_ids)]
               for req_id, n in out.num_scheduled_tokens.items()
               if req_id in sched.requests and sched.requests[req_id].num_computed_tokens + n ==
               sched.requests[req_id].num_tokens}
    sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))
    sched.finish_requests([req_id for req_id in sampled if len(sched.requests[req_id].output_token_ids) ==
                           sched.requests[req_id].sampling_params.max_tokens])


def sched_add(sched: Scheduler, request):
    sched.add_request(request)
    return request


@pytest.mark.parametrize("depth", [2, 3])
@pytest.mark.parametrize("chunked,caching", [(False, False), (True, False), (True, True)])
def test_steps_in_flight_keep_every_invariant(depth, chunked, caching):
    preemptions = sum(run_pipelined(seed, depth, chunked, caching, abort_rate=0.0) for seed in range(12))
    assert preemptions > 0, "the workloads were meant to preempt"


@pytest.mark.parametrize("depth", [2, 3])
def test_aborts_of_requests_in_flight_lose_nothing(depth):
    for seed in range(12):
        run_pipelined(seed, depth, chunked=True, caching=True, abort_rate=0.2)


def test_every_request_finishes_with_all_its_tokens_in_flight():
    """Without aborts every request gets exactly max_tokens tokens."""
    rng = random.Random(0)
    pool = BlockPool(64)
    sched = Scheduler(KVCacheManager(pool, 4, enable_caching=True), 4, 32, True)
    requests = [sched_add(sched, make_request(i, rng.randint(1, 20), rng.randint(1, 6))) for i in range(10)]
    in_flight = deque()
    while sched.has_unfinished() or in_flight:
        while len(in_flight) < 2 and not (out := sched.schedule()).is_empty:
            in_flight.append(out)
        apply_step(sched, in_flight.popleft(), lambda r: FAKE_TOKEN + len(r.output_token_ids))
    for request in requests:
        assert request.output_token_ids == [FAKE_TOKEN + k for k in range(request.sampling_params.max_tokens)]


def test_drop_in_flight_sends_the_requests_again_in_full():
    pool = BlockPool(32)
    sched = Scheduler(KVCacheManager(pool, 4, enable_caching=False), 4, 64, False)
    a, b = sched_add(sched, make_request("a", 5, 4)), sched_add(sched, make_request("b", 3, 4))
    first = sched.schedule()
    apply_step(sched, first, lambda r: FAKE_TOKEN + len(r.output_token_ids))
    second = sched.schedule()
    assert [c.new_token_ids for c in second.scheduled_cached_reqs] == [[FAKE_TOKEN], [FAKE_TOKEN]]
    sched.drop_in_flight()  # the engine stopped waiting for `second`
    assert not sched.in_flight
    again = sched.schedule()
    assert {n.req_id for n in again.scheduled_new_reqs} == {"a", "b"}  # in full: the runner may be ahead
    assert [len(n.output_token_ids) for n in again.scheduled_new_reqs] == [1, 1]
    assert a.num_computed_tokens == 5 and b.num_computed_tokens == 3
