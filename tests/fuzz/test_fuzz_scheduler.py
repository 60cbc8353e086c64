"""Fuzzing the scheduler and the KV block pool without a model: hypothesis drives random workloads
(add requests of random lengths, step, fail a step and roll it back, abort, reset the prefix cache)
on random settings, and after every operation the invariants of docs/design.md hold:
reference counts are never negative and equal the number of block tables holding each block,
free + held == usable, at most max_num_seqs run, at most max_num_batched_tokens per step; at the end
every request finishes with its max_tokens tokens (none lost or repeated) and every block is free."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fastdeploy.cache_manager.block_pool import NULL_BLOCK_ID, BlockPool
from fastdeploy.cache_manager.kv_cache_manager import KVCacheManager
from fastdeploy.engine.request import RequestStatus
from fastdeploy.engine.sched.scheduler import Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))  # tests/engine/fake_model.py
from fake_model import apply_step, scheduled, text_request  # noqa: E402

FAKE_TOKEN = 20_000  # generated token k of every request is FAKE_TOKEN + k: lost or repeated tokens show
BASES = [[(7 * i + b) % 13 for i in range(200)] for b in range(3)]  # few prompts, shared prefixes


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_token(request) -> int:
    return FAKE_TOKEN + len(request.output_token_ids)


class SchedulerWorkload(RuleBasedStateMachine):
    @initialize(block_size=st.sampled_from([1, 2, 4, 16]), num_blocks=st.integers(2, 40),
                max_num_seqs=st.integers(1, 6), extra_budget=st.integers(0, 64), chunked=st.booleans(),
                prefix=st.booleans(), threshold=st.sampled_from([0, 1, 3, 8]))
    def setup(self, block_size, num_blocks, max_num_seqs, extra_budget, chunked, prefix, threshold):
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_seqs + extra_budget
        self.sched = Scheduler(KVCacheManager(self.pool, block_size, prefix), max_num_seqs, self.budget, chunked,
                               threshold)
        # what the engine guarantees before a request is queued: one sequence fits the pool, and
        # without chunked prefill a whole prompt fits one step
        self.max_model_len = self.pool.num_usable_blocks * block_size
        if not chunked:
            self.max_model_len = min(self.max_model_len, self.budget)
        self.next_id = 0
        self.live = {}  # request_id -> Request, not finished
        self.done = []  # finished by max_tokens
        self.exact_blocks = True  # false after a rollback until the next applied step

    # ---- operations ------------------------------------------------------------------------------
    @precondition(lambda self: self.max_model_len >= 2)
    @rule(base=st.integers(0, len(BASES) - 1), data=st.data())
    def add(self, base, data):
        total = data.draw(st.integers(2, min(self.max_model_len, 80)), label="prompt + max_tokens")
        prompt_len = data.draw(st.integers(1, total - 1), label="prompt_len")
        request = text_request(f"r{self.next_id}", BASES[base][:prompt_len], total - prompt_len)
        self.next_id += 1
        self.sched.add_request(request)
        self.live[request.request_id] = request

    @rule()
    def step(self):
        self.run_step()

    def run_step(self):
        """One step: schedule, check it, apply the fake model's tokens (a subclass may run it otherwise)."""
        had_work = self.sched.has_unfinished()
        out = self.sched.schedule()
        batch = scheduled(self.sched, out)
        assert out.total_num_scheduled_tokens == sum(n for _, n in batch) <= self.budget
        assert len({r.request_id for r, _ in batch}) == len(batch), "a request scheduled twice in one step"
        assert not had_work or batch, "no progress although requests are unfinished"
        for r, n in batch:
            assert n >= 1 and r.num_computed_tokens + n <= r.num_tokens
            assert len(r.block_ids) == ceil_div(r.num_computed_tokens + n, self.block_size)
        self.check_pool()
        for r in apply_step(self.sched, out, next_token):
            assert r.output_token_ids == [FAKE_TOKEN + k for k in range(r.sampling_params.max_tokens)]
            self.done.append(self.live.pop(r.request_id))
        self.exact_blocks = True

    @rule()
    def failed_step(self):
        """The model raised inside the step: the engine rolls the scheduler back."""
        self.sched.schedule()
        self.sched.rollback()
        self.exact_blocks = False

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.live)), label="abort")
        request = self.live.pop(request_id)
        self.sched.finish_requests([request_id])
        assert request.status == RequestStatus.FINISHED and request.block_ids == []

    @rule()
    def reset_prefix_cache(self):
        self.pool.reset_prefix_cache()
        assert self.pool.num_cached_blocks == 0

    # ---- invariants ------------------------------------------------------------------------------
    def check_pool(self):
        pool, sched = self.pool, self.sched
        assert len(sched.running) <= self.max_num_seqs
        assert all(c >= 0 for c in pool.ref_counts), "negative reference count"
        holders = Counter(b for r in sched.running for b in r.block_ids)
        assert NULL_BLOCK_ID not in holders and pool.ref_counts[NULL_BLOCK_ID] == 0
        assert all(not r.block_ids for r in sched.waiting), "a waiting request holds blocks"
        for b in range(1, pool.num_blocks):
            assert pool.ref_counts[b] == holders[b], f"block {b}: ref count {pool.ref_counts[b]}, held {holders[b]}"
        held = sum(1 for b in range(1, pool.num_blocks) if pool.ref_counts[b] > 0)
        assert pool.num_free_blocks + held == pool.num_usable_blocks
        assert set(sched.requests) == set(self.live)
        assert len(sched.running) + len(sched.waiting) == len(self.live)

    @invariant()
    def pool_is_consistent(self):
        if hasattr(self, "sched"):
            self.check_pool()
            for r in self.sched.running:
                need = ceil_div(r.num_computed_tokens, self.block_size)
                assert len(r.block_ids) == need if self.exact_blocks else len(r.block_ids) >= need

    def teardown(self):
        """Every request still queued finishes, with all its tokens, and every block is free again."""
        if not hasattr(self, "sched"):
            return
        limit = 50 + sum(r.num_tokens + r.sampling_params.max_tokens for r in self.live.values()) * 20
        for _ in range(limit):
            if not self.sched.has_unfinished():
                break
            self.run_step()
            self.pool_is_consistent()
        assert not self.sched.has_unfinished(), f"requests still unfinished after {limit} steps"
        assert not self.live
        assert self.pool.num_free_blocks == self.pool.num_usable_blocks
        assert all(c == 0 for c in self.pool.ref_counts)


SchedulerWorkload.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_scheduler_workloads = SchedulerWorkload.TestCase
