"""A scheduler driven by a fake model loop (no model), checking the scheduler's invariants after every
step; used by test_scheduler.py, which tests: batching limits, block accounting,
continuous batching, chunked prefill, preemption and recompute.

The fake loop mirrors LLMEngine.step: the scheduler applies each step through
`update_from_output` (num_computed_tokens advance; a request whose whole sequence is computed gets
one generated token); a request with max_tokens generated is released with `finish_requests`.
Generated token k of every request is FAKE_TOKEN + k, so lost or duplicated tokens show.
"""
from __future__ import annotations

from fastdeploy.cache_manager.block_pool import BlockPool
from fastdeploy.cache_manager.kv_cache_manager import KVCacheManager
from fastdeploy.engine.request import Request, RequestStatus
from fastdeploy.engine.sched.scheduler import Scheduler
from fake_model import apply_step, scheduled, text_request

FAKE_TOKEN = 10_000


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def make_request(rid, prompt_len: int, max_tokens: int) -> Request:
    return text_request(str(rid), [(7 * i + 3) % 1000 for i in range(prompt_len)], max_tokens)


class FakeLoop:
    """Runs the scheduler step by step and checks its invariants after every step."""

    def __init__(self, num_blocks, block_size, max_num_seqs, max_num_batched_tokens, chunked):
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.chunked = chunked
        self.sched = Scheduler(KVCacheManager(self.pool, block_size, enable_caching=False), max_num_seqs,
                               max_num_batched_tokens, chunked)
        self.arrival: dict[str, int] = {}
        self.requests: list[Request] = []
        self.finished: list[Request] = []
        self.steps: list[list[tuple[str, int]]] = []  # per step: (request_id, num_new_tokens)
        self.computed_total: dict[str, int] = {}  # tokens scheduled for each request, all steps
        self.first_step: dict[str, int] = {}
        self.finish_step: dict[str, int] = {}
        self.running_log: list[set[str]] = []  # ids running right after each step's schedule()
        self.kinds: list[set[str]] = []  # per step: "chunk" (partial prefill) and/or "decode"

    def add(self, request: Request) -> Request:
        self.arrival[request.request_id] = len(self.arrival)
        self.requests.append(request)
        self.computed_total[request.request_id] = 0
        self.sched.add_request(request)
        return request

    def step(self) -> list[tuple[str, int]]:
        sched = self.sched
        step_no = len(self.steps)
        had_work = sched.has_unfinished()
        before = {id(r): (r.num_computed_tokens, list(r.block_ids)) for r in sched.running}
        out = sched.schedule()
        batch = scheduled(sched, out)
        items = [(r.request_id, n) for r, n in batch]
        self.steps.append(items)
        self.running_log.append({r.request_id for r in sched.running})

        # --- limits of one step
        assert len(sched.running) <= self.max_num_seqs
        assert out.total_num_scheduled_tokens == sum(n for _, n in items) <= self.budget
        assert len({rid for rid, _ in items}) == len(items), "a request scheduled twice in one step"
        if had_work:
            assert items, "no progress although requests are unfinished"
        # --- preempted requests: back in the queue, nothing kept, not scheduled
        scheduled_ids = {id(r) for r, _ in batch}
        for r in [r for r in self.requests if r.request_id in out.preempted_req_ids]:
            assert id(r) not in scheduled_ids
            assert r in sched.waiting and r not in sched.running
            assert r.status == RequestStatus.WAITING
            assert r.num_computed_tokens == 0 and r.block_ids == []
        # --- each scheduled item
        for r, num_new in batch:
            assert r in sched.running and r.status == RequestStatus.RUNNING
            assert num_new >= 1
            assert r.num_computed_tokens + num_new <= r.num_tokens
            if not self.chunked:
                if r.num_computed_tokens == 0:  # (re)prefill: the whole sequence at once
                    assert num_new == r.num_tokens, "prompt split without chunked prefill"
                else:  # decode
                    assert num_new == 1 and r.num_computed_tokens == r.num_tokens - 1
        # --- running requests keep their blocks (KV stays where it is) unless preempted
        for r in sched.running:
            if id(r) in before:
                old_computed, old_blocks = before[id(r)]
                assert r.block_ids[: len(old_blocks)] == old_blocks
                assert r.num_computed_tokens == old_computed

        # --- advance like the model would
        kinds = set()
        for r, num_new in batch:
            if r.num_computed_tokens + num_new < r.num_tokens:
                kinds.add("chunk")
            elif r.num_computed_tokens > 0 and num_new == 1 and r.output_token_ids:
                kinds.add("decode")
            self.first_step.setdefault(r.request_id, step_no)
            self.computed_total[r.request_id] += num_new
        for r in apply_step(sched, out, lambda r: FAKE_TOKEN + len(r.output_token_ids)):
            self.finished.append(r)
            self.finish_step[r.request_id] = step_no
            assert r.block_ids == [] and r.status == RequestStatus.FINISHED
        self.kinds.append(kinds)
        if not self.chunked:
            assert "chunk" not in kinds

        self.check_state()
        return items

    def check_state(self) -> None:
        sched, pool = self.sched, self.pool
        held = []
        for r in sched.running:
            assert len(r.block_ids) == ceil_div(r.num_computed_tokens, self.block_size), (
                f"request {r.request_id} holds {len(r.block_ids)} blocks for {r.num_computed_tokens} tokens"
            )
            held.extend(r.block_ids)
        for r in sched.waiting:
            assert r.block_ids == [] and r.num_computed_tokens == 0
            assert r.status == RequestStatus.WAITING
        assert 0 not in held, "the null block was handed to a request"
        assert len(set(held)) == len(held), "a block is held by two requests"
        assert all(1 <= b < pool.num_blocks for b in held)
        assert pool.num_free_blocks + len(held) == pool.num_usable_blocks
        assert len(sched.running) <= self.max_num_seqs
        # first come, first served: running (admission order) then waiting is arrival order
        order = [self.arrival[r.request_id] for r in list(sched.running) + list(sched.waiting)]
        assert order == sorted(order)

    def run(self, max_steps: int = 100_000) -> None:
        while self.sched.has_unfinished():
            assert len(self.steps) < max_steps, "scheduler does not finish"
            self.step()
        self.check_done()

    def check_done(self) -> None:
        assert not self.sched.running and not self.sched.waiting
        assert self.pool.num_free_blocks == self.pool.num_usable_blocks
        for r in self.requests:
            assert r.status == RequestStatus.FINISHED and r.block_ids == []
            assert r.output_token_ids == [FAKE_TOKEN + k for k in range(r.sampling_params.max_tokens)]
            if r.num_preemptions == 0:  # the prompt once, then one token per decode
                assert self.computed_total[r.request_id] == r.num_prompt_tokens + r.sampling_params.max_tokens - 1
            else:  # recomputed at least once
                assert self.computed_total[r.request_id] > r.num_prompt_tokens + r.sampling_params.max_tokens - 1


