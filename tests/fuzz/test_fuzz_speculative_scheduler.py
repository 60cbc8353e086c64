"""The scheduler fuzz of test_fuzz_scheduler.py with speculative decoding on (a draft model's
lookahead slots included): a fake runner accepts each step's drafts up to the first that differs
from the request's true next tokens and proposes drafts that are right or wrong at random. After
every operation the pool's invariants hold; once a step's result is applied a request holds no block
past its tokens; at the end every request has exactly its true tokens and every block is free."""
from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from fastdeploy.cache_manager.block_pool import BlockPool
from fastdeploy.cache_manager.kv_cache_manager import KVCacheManager
from fastdeploy.config import SpeculativeConfig
from fastdeploy.engine.sched.scheduler import Scheduler
from fastdeploy.worker.output import ModelRunnerOutput
from test_fuzz_scheduler import FAKE_TOKEN, SchedulerWorkload, ceil_div, scheduled


class SpeculativeWorkload(SchedulerWorkload):
    @initialize(block_size=st.sampled_from([1, 2, 4, 16]), num_blocks=st.integers(2, 40),
                max_num_seqs=st.integers(1, 6), extra_budget=st.integers(0, 64), chunked=st.booleans(),
                prefix=st.booleans(), threshold=st.sampled_from([0, 1, 3, 8]), k=st.integers(1, 5),
                method=st.sampled_from(["ngram", "draft_model"]), seed=st.integers(0, 1000))
    def setup(self, block_size, num_blocks, max_num_seqs, extra_budget, chunked, prefix, threshold, k, method,
              seed):
        super().setup(block_size, num_blocks, max_num_seqs, extra_budget, chunked, prefix, threshold)
        spec = SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": k, "model": "draft"})
        self.sched = Scheduler(KVCacheManager(self.pool, block_size, prefix), max_num_seqs, self.budget, chunked,
                               threshold, spec)
        self.k, self.rng = k, random.Random(seed)

    def run_step(self):
        had_work = self.sched.has_unfinished()
        out = self.sched.schedule()
        batch = scheduled(self.sched, out)
        assert out.total_num_scheduled_tokens == sum(n for _, n in batch) <= self.budget
        assert not had_work or batch, "no progress although requests are unfinished"
        drafts = out.scheduled_spec_decode_tokens
        for r, n in batch:
            real = n - len(drafts.get(r.request_id, ()))
            assert real >= 1 and r.num_computed_tokens + real <= r.num_tokens
            assert len(drafts.get(r.request_id, ())) <= r.sampling_params.max_tokens - len(r.output_token_ids) - 1
            assert len(r.block_ids) >= ceil_div(r.num_computed_tokens + n, self.block_size)
        self.check_pool()
        sampled, proposed = {}, {}
        for r, n in batch:
            step_drafts = drafts.get(r.request_id, [])
            if r.num_computed_tokens + n - len(step_drafts) != r.num_tokens:
                continue
            true = [FAKE_TOKEN + len(r.output_token_ids) + j for j in range(len(step_drafts) + 1)]
            kept = next((true[: j + 1] for j, d in enumerate(step_drafts) if d != true[j]), true)
            sampled[r.request_id] = kept
            if r.request_id in out.spec_decode_req_ids:
                start = len(r.output_token_ids) + len(kept)
                proposed[r.request_id] = [FAKE_TOKEN + start + j + (self.rng.random() < 0.3)
                                          for j in range(self.rng.randint(0, self.k))]
        self.sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled, draft_token_ids=proposed))
        for req_id in sampled:
            r = self.sched.requests[req_id]
            # rejected drafts' and lookahead slots freed; the last token's slot comes with the next step
            assert ceil_div(r.num_computed_tokens, self.block_size) <= len(r.block_ids) <= \
                ceil_div(r.num_tokens, self.block_size)
            assert len(r.output_token_ids) <= r.sampling_params.max_tokens
            if len(r.output_token_ids) == r.sampling_params.max_tokens:
                assert r.output_token_ids == [FAKE_TOKEN + j for j in range(r.sampling_params.max_tokens)]
                self.sched.finish_requests([req_id])
                self.done.append(self.live.pop(req_id))
        self.exact_blocks = False  # blocks of the tokens (not only the computed ones): checked above


SpeculativeWorkload.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_speculative_scheduler_workloads = SpeculativeWorkload.TestCase
