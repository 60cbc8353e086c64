"""Who speculates in a step: the scheduler's speculative-decoding policy. Plain Python, no tensors.

A request verifies the drafts the runner proposed for it (`Request.spec_token_ids`) when
- speculation is on for the step: no more than `disable_by_batch_size` requests run (a large batch
  is no longer bound by reading the weights, so extra rows cost about what they bring);
- its recent drafts paid: below MIN_ACCEPTANCE of the last WINDOW drafted tokens accepted, it stops
  speculating for PAUSE decode steps, then tries again with a fresh window. A draft rejected costs
  a verified row for nothing, so a request whose text does not repeat (open-ended writing) soon
  stops paying for it;
- it verifies no more drafts than its recent runs of accepted drafts suggest (its draft limit,
  TCP's slow start in spirit): FIRST_LIMIT at first, doubled (up to k) after a verification that
  accepted every draft, else one more than that verification accepted. A request copying its
  prompt soon verifies k drafts a step; one whose lookups are chance matches verifies one, at the
  cost of one row;
- the step's rows stay few: decodes and drafts together at most MAX_VERIFY_ROWS, the rows where a
  step still costs about one read of the weights (at more rows the matmuls are bound by arithmetic,
  and a draft row costs about what a decode row does, so rejected drafts slow the batch down);
  drafts go to the decodes in schedule order until the room is used;
- the step's token budget and its `max_tokens` leave room: at most max_tokens - generated - 1
  drafts (the step may emit every draft plus one token).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fastdeploy.config import SpeculativeConfig
from fastdeploy.engine.request import Request

WINDOW = 16  # drafted tokens a request's acceptance rate is judged on
MIN_ACCEPTANCE = 0.2  # accepted / drafted below which it pauses
PAUSE = 16  # decode steps without speculation before it tries again
FIRST_LIMIT = 2  # drafts a request verifies at first
MAX_VERIFY_ROWS = 16  # decode + draft rows of a step (the GGUF kernels' switch to their many-row kernel)


@dataclass
class SpecState:
    """One request's recent verifications: (drafted, accepted) per step, newest last; its draft limit."""

    recent: deque = field(default_factory=deque)
    paused: int = 0  # decode steps left without speculation
    limit: int = FIRST_LIMIT  # drafts it may verify in a step


class SpeculationPolicy:
    def __init__(self, config: SpeculativeConfig):
        self.config = config

    def step_is_on(self, num_running: int) -> bool:
        """Whether any request speculates in a step with `num_running` running requests."""
        limit = self.config.disable_by_batch_size
        return limit is None or num_running <= limit

    def draft_rows(self, num_decodes: int) -> int:
        """Draft rows a step with `num_decodes` decodes may verify."""
        return max(0, MAX_VERIFY_ROWS - num_decodes)

    def may_speculate(self, request: Request) -> bool:
        """Whether `request` may verify drafts, or have them proposed, when the step is on."""
        return request.sampling_params is not None and _state(request).paused == 0

    def drafts(self, request: Request, budget: int) -> list[int]:
        """The drafts `request` (a decode) verifies in this step, within `budget` more tokens; a
        paused request counts the step towards its pause."""
        state = _state(request)
        if state.paused:
            state.paused -= 1
            return []
        if not self.may_speculate(request):
            return []
        room = request.sampling_params.max_tokens - len(request.output_token_ids) - 1
        return request.spec_token_ids[: max(0, min(room, budget, state.limit))]

    def record(self, request: Request, drafted: int, accepted: int) -> None:
        """A verification's result; pauses the request when its recent acceptance fell too low."""
        state = _state(request)
        k = self.config.num_speculative_tokens
        state.limit = min(k, 2 * state.limit) if accepted == drafted else accepted + 1
        state.recent.append((drafted, accepted))
        total = sum(d for d, _ in state.recent)
        while total - state.recent[0][0] >= WINDOW:
            total -= state.recent.popleft()[0]
        if total >= WINDOW and sum(a for _, a in state.recent) < MIN_ACCEPTANCE * total:
            state.recent.clear()
            state.paused = PAUSE
            request.spec_token_ids = []


def _state(request: Request) -> SpecState:
    if request.spec_state is None:
        request.spec_state = SpecState()
    return request.spec_state
