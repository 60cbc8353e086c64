"""Continuous batching with a token budget, chunked prefill, prefix caching and preemption.
Plain Python: sees requests and block ids, no tensors.

The scheduler is policy: who runs, in which order, how many tokens each computes, whom to preempt.
It asks the KV cache manager (cache_manager/kv_cache_manager.py) for the mechanism: a request's
cached prefix, its blocks (None when the pool is short), registering full blocks in the prefix
cache, freeing, and undoing a failed step's blocks.

Each `schedule()` builds one model step from a budget of `max_num_batched_tokens` tokens:
1. decodes: running requests that need one token, in admission order;
2. running prefills (prompts, or recomputation after preemption, not yet all in the cache);
3. waiting requests, FIFO, while fewer than `max_num_seqs` run, budget is left and the pool has
   blocks. A new request first takes its longest cached prefix (whole blocks, leaving at least one
   token to compute so the step yields logits), then needs blocks for the rest;
4. with chunked prefill, budget left over tops up the running prefills.
With chunked prefill, steps 2-3 give each prefill at most `long_prefill_token_threshold` tokens,
so a short prompt queued behind a long one joins the next step instead of waiting for the whole
long prefill; without it, a prompt joins only when all of it fits the step.
A chunk never splits an image's or video's placeholder tokens (`whole_items_chunk`): it stops before
an item, or takes the item whole (past the threshold, within the step's budget), so the runner
encodes each item in the step that computes its tokens. The input processor refuses items longer
than the budget, so every item fits some step.

With speculative decoding (`speculative_config`), a decode in step 1 also verifies the drafts the
runner proposed for it, as many as the policy (spec_decode/policy.py) and the budget allow: it
computes 1 + k tokens, with blocks for them and, for a draft model, lookahead slots where the draft
writes its next drafts' K/V after the step. If the pool cannot give those, it decodes one token as
usual. `update_from_output` counts only the accepted drafts as computed and frees the blocks past
the request's tokens. Drafts' blocks are registered in the prefix cache only once accepted.

With pipeline parallelism the engine keeps up to `pipeline_parallel_size` = P steps in flight
(engine.py): a request of a step whose result has not come back is not scheduled again (its tokens
and `num_computed_tokens` are not known yet) nor preempted, and `update_from_output` takes the
results in the order the steps were built. A step then holds at most 1/P of the active requests
(ceil(min(max_num_seqs, running + waiting) / P)), so the requests form P micro-batches that keep every
stage busy instead of one batch that leaves the next step empty. Each `CachedRequestData` carries
the tokens sampled for the request since the runner last heard of it, for the stages that sample nothing.

When the pool has no block for a request of steps 1-2, the most recently admitted running request
not in flight is preempted: its blocks are freed (kept in the prefix cache), its state reset to recompute, and it
goes back to the front of the queue; no new request joins in that step.

`schedule()` returns a `SchedulerOutput` (sched/output.py: ids, token counts and block ids, no
`Request`), and the step's result comes back through `update_from_output`, which advances
`num_computed_tokens` and appends the sampled tokens. If the step fails instead (an exception or
Ctrl-C inside the model), `rollback` undoes what `schedule()` promised: the KV cache manager
forgets prefix-cache blocks registered for KV that was never written, requests admitted in the
step go back to the queue, and every scheduled request is sent to the runner again in full.

Invariants: at most `max_num_seqs` requests run; at most `max_num_batched_tokens` tokens per step;
a request holds exactly ceil(num_computed_tokens_after_step / block_size) blocks (with speculative
decoding, ceil(num_tokens / block_size) once the step's result is applied); a finished
request holds none; every block's reference count equals the number of block tables holding it.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable, Optional

from fastdeploy.cache_manager.kv_cache_manager import KVCacheManager
from fastdeploy.config import SpeculativeConfig
from fastdeploy.engine.request import Request, RequestStatus
from fastdeploy.engine.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from fastdeploy.spec_decode.policy import SpeculationPolicy
from fastdeploy.spec_decode.verify import num_rejected
from fastdeploy.worker.output import ModelRunnerOutput


class Scheduler:
    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        long_prefill_token_threshold: int = 0,
        speculative_config: Optional[SpeculativeConfig] = None,
        max_in_flight: int = 1,
    ) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.prefill_cap = long_prefill_token_threshold if enable_chunked_prefill and long_prefill_token_threshold > 0 \
            else max_num_batched_tokens
        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._finished_ids: set[str] = set()  # finished since the last step: the runner drops them
        self._step: _Step = _Step(0)  # the last step built, kept for rollback
        self.in_flight: set[Request] = set()  # scheduled in a step whose result has not come back
        self.max_in_flight = max_in_flight  # steps the engine keeps in flight (pipeline stages)
        self.spec_policy = SpeculationPolicy(speculative_config) if speculative_config is not None else None
        self.lookahead = speculative_config.draft_lookahead if speculative_config is not None else 0

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already queued or running")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ---------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        active = min(self.max_num_seqs, len(self.running) + len(self.waiting))
        step = self._step = _Step(self.max_num_batched_tokens, -(-active // self.max_in_flight))
        self.kv_cache_manager.begin_step()
        ready = [r for r in self.running if r not in self.in_flight]
        decodes = [r for r in ready if r.num_tokens - r.num_computed_tokens == 1]
        if self.spec_policy is not None:
            step.speculating = self.spec_policy.step_is_on(len(self.running))
            step.draft_room = self.spec_policy.draft_rows(len(decodes))
        prefills = [r for r in ready if r.num_tokens - r.num_computed_tokens > 1]
        for request in decodes + prefills:
            if request not in self.running or step.full:  # preempted while making room for an earlier one
                continue
            num_new = min(request.num_tokens - request.num_computed_tokens, self.prefill_cap, step.budget)
            num_new = whole_items_chunk(request.mm_features, request.num_computed_tokens, num_new, step.budget)
            if num_new <= 0:
                continue
            if step.speculating and request.num_tokens - request.num_computed_tokens == 1:
                drafts = self._reserve_speculative(request, step)
                if drafts is not None:
                    step.add(request, 1 + len(drafts))
                    step.drafts[request] = drafts
                    continue
            if not self._reserve_blocks(request, num_new, step):
                continue  # it preempted itself; earlier-admitted requests may use what it freed
            step.add(request, num_new)
        if not step.preempted:
            self._admit_waiting(step)
        if self.enable_chunked_prefill:
            self._top_up_prefills(step)
        for request, num_new in step.tokens.items():  # no preemption follows: their KV will be written
            # (drafts are not the request's tokens yet: their blocks are registered once accepted)
            self.kv_cache_manager.cache_blocks(request, min(request.num_computed_tokens + num_new, request.num_tokens))
        if not step.tokens:  # (finished ids wait for a step that reaches the runner)
            return SchedulerOutput()
        self.in_flight.update(step.tokens)
        return self._make_output(step)

    def _make_output(self, step: "_Step") -> SchedulerOutput:
        out = SchedulerOutput(finished_req_ids=self._finished_ids, preempted_req_ids={r.request_id for r in step.preempted},
                              scheduled_spec_decode_tokens={r.request_id: d for r, d in step.drafts.items()})
        if step.speculating and self.spec_policy.draft_rows(len(self.running)) > 0:  # drafts could run next step
            out.spec_decode_req_ids = {r.request_id for r in step.tokens if self.spec_policy.may_speculate(r)}
        step.finished_sent, self._finished_ids = self._finished_ids, set()
        for request, num_new in step.tokens.items():
            out.num_scheduled_tokens[request.request_id] = num_new
            if request.num_blocks_sent is None:
                out.scheduled_new_reqs.append(_new_request_data(request))
            else:
                new_blocks = request.block_ids[request.num_blocks_sent :]
                out.scheduled_cached_reqs.append(CachedRequestData(
                    request.request_id, new_blocks, request.num_computed_tokens, request.num_blocks_sent,
                    request.output_token_ids[request.num_output_sent :]))
            request.num_blocks_sent = len(request.block_ids)
            request.num_output_sent = len(request.output_token_ids)
        return out

    def _reserve_blocks(self, request: Request, num_new: int, step: "_Step") -> bool:
        """Give `request` blocks for `num_new` more tokens, preempting later requests if needed."""
        while self.kv_cache_manager.allocate_slots(request, num_new) is None:
            victim = next((r for r in reversed(self.running) if r not in self.in_flight), None)
            if victim is None:  # only requests in flight could make room: wait for their results
                return False
            step.remove(victim)
            self._preempt(victim)
            step.preempted.append(victim)
            if victim is request:
                return False
        return True

    def _reserve_speculative(self, request: Request, step: "_Step") -> Optional[list[int]]:
        """Blocks for a decode's token, the drafts it verifies (the policy's choice within the step's
        budget) and the lookahead slots a draft model writes after the step; the drafts, or None when
        the pool is short of that (the decode then reserves its one token as any decode does)."""
        drafts = self.spec_policy.drafts(request, min(step.budget - 1, step.draft_room))
        if not drafts and not self.lookahead:
            return None
        if self.kv_cache_manager.allocate_slots(request, 1 + len(drafts), num_lookahead_tokens=self.lookahead) is None:
            return None
        step.draft_room -= len(drafts)
        return drafts

    def _admit_waiting(self, step: "_Step") -> None:
        while self.waiting and step.budget > 0 and len(self.running) < self.max_num_seqs and not step.full:
            request = self.waiting[0]
            prefix = self.kv_cache_manager.get_computed_blocks(request)
            computed = prefix.num_tokens
            remaining = request.num_tokens - computed
            if remaining > step.budget and not self.enable_chunked_prefill:
                break
            num_new = whole_items_chunk(request.mm_features, computed, min(remaining, self.prefill_cap, step.budget),
                                        step.budget)
            if num_new <= 0:
                break
            if self.kv_cache_manager.allocate_slots(request, num_new, prefix) is None:
                break
            self.waiting.popleft()
            request.num_computed_tokens = computed
            step.admitted.append((request, request.num_cached_tokens))
            if request.num_cached_tokens is None:  # reported for the first admission
                request.num_cached_tokens = computed
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            step.add(request, num_new)
            self.kv_cache_manager.cache_blocks(request, computed + num_new)  # later admissions may share them now

    def _top_up_prefills(self, step: "_Step") -> None:
        """Budget left after everyone's share goes to running prefills, in admission order."""
        for request in self.running:
            if step.budget <= 0:
                return
            scheduled = step.tokens.get(request, 0)
            remaining = request.num_tokens - request.num_computed_tokens - scheduled
            if (request.num_tokens - request.num_computed_tokens <= 1 or remaining <= 0 or request in self.in_flight
                    or (step.full and request not in step.tokens)):
                continue
            start = request.num_computed_tokens + scheduled
            room = self.kv_cache_manager.num_tokens_fitting(request) - start
            extra = whole_items_chunk(request.mm_features, start, min(remaining, step.budget, room),
                                      min(step.budget, room))
            if extra <= 0 or self.kv_cache_manager.allocate_slots(request, scheduled + extra) is None:
                continue
            step.add(request, extra)

    def sampling_req_ids(self, scheduler_output: SchedulerOutput) -> list[str]:
        """The scheduled requests that sample a token in this step: those whose whole sequence is in
        the KV cache after it, drafts aside (the model runner's rule)."""
        drafts = scheduler_output.scheduled_spec_decode_tokens
        return [req_id for req_id, n in scheduler_output.num_scheduled_tokens.items()
                if self.requests[req_id].num_computed_tokens + n - len(drafts.get(req_id, ())) ==
                self.requests[req_id].num_tokens]

    # ---- the step's result ------------------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> None:
        """Apply a step's result: each scheduled request's tokens are now in the KV cache
        (`num_computed_tokens` advances), sampled tokens are appended, scored prompt positions counted."""
        self._step = _Step(0)  # (steps in flight are never rolled back: drop_in_flight)
        self.kv_cache_manager.commit_step()
        for req_id, num_new in scheduler_output.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            if request is None:  # finished or aborted meanwhile
                continue
            self.in_flight.discard(request)
            tokens = runner_output.sampled_token_ids.get(req_id, ())
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
            if drafts:  # the rejected drafts' K/V were written but are not the sequence's
                num_new -= num_rejected(drafts, tokens)
                self.spec_policy.record(request, len(drafts), len(tokens) - 1)
            request.num_computed_tokens += num_new
            request.output_token_ids.extend(tokens)
            if self.spec_policy is not None:
                request.spec_token_ids = runner_output.draft_token_ids.get(req_id, [])
                self._release_unused_slots(request)
            scored = runner_output.prompt_logprobs.get(req_id)
            if scored is not None and len(scored.positions):
                request.num_prompt_logprobs_done = int(scored.positions.max()) + 1

    def _release_unused_slots(self, request: Request) -> None:
        """Free the blocks past the request's tokens (rejected drafts', a draft model's lookahead);
        the runner cuts its block table alike at the next step (CachedRequestData.num_kept_blocks)."""
        self.kv_cache_manager.free_slots_after(request, request.num_tokens)
        if request.num_blocks_sent is not None:
            request.num_blocks_sent = min(request.num_blocks_sent, len(request.block_ids))

    def rollback(self) -> None:
        """Undo the last `schedule()` after its step failed (the model raised, or Ctrl-C).

        The KV cache manager undoes the step's blocks (`rollback_step`: prefix-cache blocks
        registered for the step's tokens hold no KV and are forgotten; blocks the step gave running
        requests are freed again). Requests admitted in the step go back to the front of the queue
        (their prefix hits may name those blocks). Every request of the step is sent to the runner
        again in full, and the runner is told again which requests finished, since the failed step
        may not have reached it.
        """
        step, self._step = self._step, _Step(0)
        self.kv_cache_manager.rollback_step()
        for request, cached_before in reversed(step.admitted):
            if request in self.running:
                self._requeue(request)  # not a preemption: the step never ran
                request.num_cached_tokens = cached_before
        for request in step.tokens:
            request.num_blocks_sent = None
        self.in_flight.difference_update(step.tokens)
        self._finished_ids |= step.finished_sent

    def drop_in_flight(self) -> None:
        """Forget the results of every step in flight (the engine stopped waiting for them: an
        exception or Ctrl-C): their requests are scheduled again from what the scheduler knows, and
        sent to the runner in full (its states may have advanced by the dropped results). Their K/V
        are written all the same (every stage runs its steps in order), so no block is undone."""
        for request in self.in_flight:
            request.num_blocks_sent = None
        self.in_flight.clear()

    # ---- leaving --------------------------------------------------------------------------------------
    def _preempt(self, request: Request) -> None:
        self._requeue(request)
        request.num_preemptions += 1

    def _requeue(self, request: Request) -> None:
        """Back to the front of the queue with no blocks, to be recomputed from its first token."""
        self.running.remove(request)
        self.kv_cache_manager.free(request)
        request.num_computed_tokens = 0
        request.num_blocks_sent = None  # the runner drops it; it is sent again in full
        request.spec_token_ids = []
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)

    def finish_requests(self, req_ids: Iterable[str]) -> None:
        """Release finished or aborted requests' blocks and forget them (unknown ids are ignored);
        the next SchedulerOutput tells the runner to drop their state."""
        for req_id in req_ids:
            request = self.requests.pop(req_id, None)
            if request is None:
                continue
            if request in self.running:
                self.running.remove(request)
            elif request in self.waiting:
                self.waiting.remove(request)
            self.kv_cache_manager.free(request)
            self.in_flight.discard(request)  # a stage computing it meanwhile writes only its own layers' K/V
            request.status = RequestStatus.FINISHED
            self._finished_ids.add(req_id)


def whole_items_chunk(features: list, start: int, num_new: int, limit: int) -> int:
    """`num_new` prompt tokens from `start`, changed so that the chunk ends inside no item: a chunk
    ending inside an item that begins after `start` stops before it; one ending inside an item that
    began at or before `start` takes the item to its end if the chunk stays within `limit` tokens, else
    0 (the request waits for a step with room)."""
    end = start + num_new
    for f in features:
        if f.offset < end < f.offset + f.length:
            if f.offset > start:
                return f.offset - start
            return f.offset + f.length - start if f.offset + f.length - start <= limit else 0
    return num_new


def _new_request_data(request: Request) -> NewRequestData:
    return NewRequestData(
        req_id=request.request_id,
        prompt_token_ids=request.prompt_token_ids,
        output_token_ids=list(request.output_token_ids),
        sampling_params=request.sampling_params,
        positions=request.positions,
        block_ids=list(request.block_ids),
        num_computed_tokens=request.num_computed_tokens,
        eos_token_ids=request.eos_token_ids,
        bad_words_token_ids=request.bad_words_token_ids,
        index=request.index,
        token_type_ids=request.token_type_ids,
        mm_features=request.mm_features,
        wants_prompt_logprobs=request.wants_prompt_logprobs,
        num_prompt_logprobs_done=request.num_prompt_logprobs_done,
        pooling_params=request.pooling_params,
    )


class _Step:
    """The step being built (and, until its result is applied, what `rollback` undoes)."""

    def __init__(self, budget: int, max_requests: int = 0):
        self.budget = budget
        self.max_requests = max_requests  # requests the step may hold (a share of them, with steps in flight)
        self.tokens: dict[Request, int] = {}  # insertion order = schedule order
        self.preempted: list[Request] = []
        self.admitted: list[tuple[Request, object]] = []  # (request, its num_cached_tokens before)
        self.finished_sent: set[str] = set()  # finished ids this step's output told the runner
        self.speculating = False  # requests may verify drafts in this step (the policy's batch rule)
        self.drafts: dict[Request, list[int]] = {}  # the drafts each speculating decode verifies
        self.draft_room = 0  # draft rows the step may still verify (the policy's row cap)

    @property
    def full(self) -> bool:
        return len(self.tokens) >= self.max_requests

    def add(self, request: Request, num_new: int) -> None:
        self.tokens[request] = self.tokens.get(request, 0) + num_new
        self.budget -= num_new

    def remove(self, request: Request) -> None:
        self.budget += self.tokens.pop(request, 0)
        self.drafts.pop(request, None)
