"""The fake model loop of the prefix-caching scheduler tests (test_prefix_caching_scheduler.py).

The fake model mirrors LLMEngine.step and simulates the KV cache: computing position p of a
request writes key(p) = a hash of the request's tokens 0..p into slot p % block_size of block
block_ids[p // block_size]. After every step each running request must read, through its block
table, exactly its own keys for every computed position: a hit on a block holding another
prefix, a block overwritten while shared, or a block handed out while in use all show there.
Generated tokens are a function of the sequence so far (like greedy decoding), so requests with
the same prompt generate the same tokens and can share output blocks too.
"""
from __future__ import annotations

from fastdeploy.cache_manager.block_pool import NULL_BLOCK_ID, BlockPool
from fastdeploy.cache_manager.kv_cache_manager import KVCacheManager
from fastdeploy.engine.request import Request, RequestStatus
from fastdeploy.engine.sched.scheduler import Scheduler
from fake_model import apply_step, scheduled, text_request


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_token(tokens: list[int]) -> int:
    """The fake model's 'greedy' choice: a function of the whole sequence."""
    return (hash(tuple(tokens[-8:])) + 31 * len(tokens)) % 5000


def expected_output(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt):]


def make_request(rid, prompt: list[int], max_tokens: int) -> Request:
    return text_request(str(rid), list(prompt), max_tokens)


class PrefixLoop:
    """Runs a prefix-caching scheduler step by step, simulating the KV cache, checking invariants."""

    def __init__(self, num_blocks, block_size, max_num_seqs, budget, chunked, threshold=0):
        self.pool = BlockPool(num_blocks)
        self.bs = block_size
        self.max_num_seqs = max_num_seqs
        self.budget = budget
        self.chunked = chunked
        self.sched = Scheduler(KVCacheManager(self.pool, block_size, enable_caching=True), max_num_seqs, budget,
                               chunked, long_prefill_token_threshold=threshold)
        self.kv: dict[int, list] = {}  # block id -> the key written to each slot (None: never)
        self.keys: dict[int, list[int]] = {}  # id(request) -> key of each of its positions so far
        self.requests: list[Request] = []
        self.finished: list[Request] = []
        self.aborted: list[Request] = []
        self.steps: list[list[tuple[str, int]]] = []
        self.admissions: list[tuple[Request, int]] = []  # (request, num_computed_tokens when admitted)
        self.num_preempted = 0
        self.max_ref_count = 0
        self.empty_steps: list[int] = []  # steps that scheduled nothing although work was left

    def add(self, request: Request) -> Request:
        self.requests.append(request)
        self.sched.add_request(request)
        return request

    def key(self, r: Request, p: int) -> int:
        keys = self.keys.setdefault(id(r), [])
        while len(keys) <= p:
            i = len(keys)
            keys.append(hash((keys[-1] if keys else None, r.token_ids_between(i, i + 1)[0])))
        return keys[p]

    def read(self, r: Request, p: int):
        return self.kv.setdefault(r.block_ids[p // self.bs], [None] * self.bs)[p % self.bs]

    def step(self) -> list[tuple[str, int]]:
        sched = self.sched
        running_before = list(sched.running)
        decode_ready = [r for r in running_before if r.num_tokens - r.num_computed_tokens == 1]
        had_work = sched.has_unfinished()
        out = sched.schedule()
        batch = scheduled(sched, out)
        items = [(r.request_id, n) for r, n in batch]
        self.steps.append(items)
        self.num_preempted += len(out.preempted_req_ids)

        assert out.total_num_scheduled_tokens <= self.budget
        assert len(sched.running) <= self.max_num_seqs
        assert len({id(r) for r, _ in batch}) == len(batch)
        if had_work and not items:
            self.empty_steps.append(len(self.steps) - 1)
        scheduled_now = {id(r): n for r, n in batch}
        preempted = {id(r) for r in self.requests if r.request_id in out.preempted_req_ids}
        # decodes are never left out: each is scheduled for its one token, or was preempted
        for r in decode_ready:
            if id(r) in preempted:
                assert r in sched.waiting and r.block_ids == []
            else:
                assert scheduled_now.get(id(r)) == 1, f"decode of {r.request_id} left out of the step"
        for r, num_new in batch:
            assert r in sched.running and r.status == RequestStatus.RUNNING
            assert 1 <= num_new and r.num_computed_tokens + num_new <= r.num_tokens
            if not self.chunked and r.num_computed_tokens + num_new < r.num_tokens:
                raise AssertionError("a prompt split without chunked prefill")
            if r not in running_before:  # admitted in this step: it starts at its cache hit
                c = r.num_computed_tokens
                assert c % self.bs == 0 and c < r.num_tokens, (r.request_id, c, r.num_tokens)
                assert len(r.block_ids) >= c // self.bs
                self.admissions.append((r, c))

        # the model: every K/V of the step is written before any attention reads the cache
        for r, num_new in batch:
            for p in range(r.num_computed_tokens, r.num_computed_tokens + num_new):
                block = r.block_ids[p // self.bs]
                assert block != NULL_BLOCK_ID and self.pool.ref_counts[block] >= 1
                self.kv.setdefault(block, [None] * self.bs)[p % self.bs] = self.key(r, p)
        for r, num_new in batch:  # attention reads every earlier position of the sequence
            for p in range(r.num_computed_tokens + num_new):
                assert self.read(r, p) == self.key(r, p), (
                    f"request {r.request_id} reads wrong KV at position {p} (block {r.block_ids[p // self.bs]})"
                )
        # advance like LLMEngine.step
        for r in apply_step(sched, out, lambda r: next_token(r.prompt_token_ids + r.output_token_ids)):
            self.finished.append(r)
            assert r.block_ids == [] and r.status == RequestStatus.FINISHED
        self.check_state()
        return items

    def abort(self, r: Request) -> None:
        """What LLMEngine.abort_request does to an unfinished request."""
        self.sched.finish_requests([r.request_id])
        self.aborted.append(r)
        assert r.block_ids == [] and r.status == RequestStatus.FINISHED
        self.check_state()

    def check_state(self) -> None:
        sched, pool = self.sched, self.pool
        counts = [0] * pool.num_blocks
        for r in sched.running:
            assert NULL_BLOCK_ID not in r.block_ids, f"the null block in {r.request_id}'s block table"
            assert len(set(r.block_ids)) == len(r.block_ids)
            assert len(r.block_ids) == ceil_div(r.num_computed_tokens, self.bs)
            for b in r.block_ids:
                counts[b] += 1
            for p in range(r.num_computed_tokens):  # its KV is intact, even in shared blocks
                assert self.read(r, p) == self.key(r, p), f"{r.request_id}: KV at {p} overwritten"
        for r in sched.waiting:
            assert r.block_ids == [] and r.num_computed_tokens == 0 and r.status == RequestStatus.WAITING
        assert min(pool.ref_counts) >= 0, "a negative reference count"
        assert pool.ref_counts == counts, "ref counts differ from the block tables holding them"
        assert pool.num_free_blocks == sum(1 for b in range(1, pool.num_blocks) if counts[b] == 0)
        self.max_ref_count = max(self.max_ref_count, max(counts))

    def check_done(self) -> None:
        assert not self.sched.has_unfinished()
        assert self.pool.num_free_blocks == self.pool.num_usable_blocks
        assert all(c == 0 for c in self.pool.ref_counts)
        for r in self.requests:
            assert r.status == RequestStatus.FINISHED and r.block_ids == []
            if r in self.aborted:
                assert len(r.output_token_ids) < r.sampling_params.max_tokens
            else:
                assert r.output_token_ids == expected_output(r.prompt_token_ids, r.sampling_params.max_tokens)


