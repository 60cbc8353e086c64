"""Continuous batching with a token budget. Plain Python: sees requests and block ids, no tensors.

Each `schedule()` builds one model step:
1. Running requests first, in arrival order: each gets the tokens it still needs (1 at decode;
   the rest of its prompt, or a chunk of it, during prefill). When the pool has no block for
   one, the most recently admitted running request is preempted (its blocks freed, its state
   reset to recompute) and put back at the front of the queue.
2. Then waiting requests join, in order, while fewer than `max_num_seqs` run, the step has
   token budget left (`max_num_batched_tokens`) and the pool has blocks for them. Without chunked
   prefill a prompt joins only when all of it fits in the step's budget.

Invariants: at most `max_num_seqs` requests run; at most `max_num_batched_tokens` tokens are
scheduled per step; a request holds exactly ceil(num_computed_tokens_after_step / block_size)
blocks; a finished request holds none.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from fastdeploy.cache_manager.block_pool import BlockPool
from fastdeploy.engine.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens computed for it this step, starting at request.num_computed_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    preempted: list[Request]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
    ) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        for request in list(self.running):
            if request not in self.running:  # preempted while making room for an earlier one
                continue
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if num_new <= 0:
                continue
            if not self._reserve_blocks(request, num_new, preempted):
                break
            scheduled.append(ScheduledRequest(request, num_new))
            budget -= num_new
        if not preempted:
            budget = self._admit_waiting(budget, scheduled)
        return SchedulerOutput(scheduled, preempted)

    def _reserve_blocks(self, request: Request, num_new: int, preempted: list[Request]) -> bool:
        """Give `request` blocks for `num_new` more tokens, preempting later requests if needed."""
        need = self.blocks_needed(request.num_computed_tokens + num_new) - len(request.block_ids)
        while not self.block_pool.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        request.block_ids.extend(self.block_pool.allocate(need))
        return True

    def _admit_waiting(self, budget: int, scheduled: list[ScheduledRequest]) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            num_new = request.num_tokens - request.num_computed_tokens
            if num_new > budget:
                if not self.enable_chunked_prefill:
                    break
                num_new = budget
            need = self.blocks_needed(num_new)
            if not self.block_pool.can_allocate(need):
                break
            self.waiting.popleft()
            request.block_ids = self.block_pool.allocate(need)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(ScheduledRequest(request, num_new))
            budget -= num_new
        return budget

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.block_pool.free(request.block_ids)
        request.block_ids = []
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)

    def finish(self, request: Request) -> None:
        """Release a finished or aborted request's blocks and forget it."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.block_pool.free(request.block_ids)
        request.block_ids = []
        request.status = RequestStatus.FINISHED
