"""The step contract between the scheduler and the model runner(s): what crosses to the workers.

A `SchedulerOutput` describes one model step without any `Request` object, so it pickles and can
be sent to worker processes (tensor parallelism). It carries a request's data once, when the
request (re)joins the runner (`NewRequestData`: its tokens, sampling parameters, positions and
block ids), and afterwards only per-step differences (`CachedRequestData`: blocks added this step).
The runner keeps its own per-request state from these; `finished_req_ids` (finished, aborted) and
`preempted_req_ids` tell it which state to drop. A preempted request that runs again is sent as new.

The runner answers with a `ModelRunnerOutput` (worker/output.py); the scheduler applies it in
`Scheduler.update_from_output` (vLLM v1's split of the same responsibilities).
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Optional, Union

import numpy as np

from fastdeploy.engine.pooling_params import PoolingParams
from fastdeploy.engine.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request the runner has no state for: everything it needs, sent once.

    Attributes:
        req_id: the request's id.
        prompt_token_ids: [num_prompt_tokens] prompt ids.
        output_token_ids: tokens generated before a preemption (empty for a fresh request).
        sampling_params: the resolved parameters (defaults filled in, max_tokens clamped); None for a
            pooling request.
        pooling_params: a pooling request's resolved PoolingParams (its prompt is pooled in the step
            that computes all of it; nothing is sampled), else None.
        positions: [num_prompt_tokens] int64 (or [3, num_prompt_tokens] for M-RoPE): the prompt's
            per-token positions, built by the input processor. A token after the prompt at index i
            (prompt + generated) has position i + position_delta on every axis.
        token_type_ids: [num_prompt_tokens] int64 modality of each prompt token (0 text), or None
            for all text; generated tokens are text.
        mm_features: the prompt's images and videos (multimodal/inputs.py MultiModalFeature), in
            prompt order; empty for text.
        block_ids: the request's KV blocks so far (block table).
        num_computed_tokens: tokens already in the KV cache (prefix-cache hit) before this step.
        eos_token_ids: ids that end the request (masked while fewer than min_tokens are generated).
        bad_words_token_ids: banned token-id sequences (layers/sample/bad_words.py).
        index: which of the prompt's n completions (seeded draws use it).
        wants_prompt_logprobs: score the prompt's tokens (the first of a prompt's n completions,
            when its sampling params ask for prompt logprobs).
        num_prompt_logprobs_done: prompt positions already scored; positions below it are not
            scored again after a preemption.
    """

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: Optional[SamplingParams]
    positions: np.ndarray
    block_ids: list[int]
    num_computed_tokens: int
    eos_token_ids: frozenset = frozenset()
    bad_words_token_ids: list = field(default_factory=list)
    index: int = 0
    token_type_ids: Optional[np.ndarray] = None
    mm_features: list = field(default_factory=list)
    wants_prompt_logprobs: bool = False
    num_prompt_logprobs_done: int = 1
    pooling_params: Optional[PoolingParams] = None

    @property
    def position_delta(self) -> int:
        """Offset from a generated token's index to its position (0 for 1-D arange positions)."""
        return int(self.positions.max()) + 1 - len(self.prompt_token_ids) if len(self.prompt_token_ids) else 0


@dataclass
class CachedRequestData:
    """A request the runner already holds: its block table is cut to its first `num_kept_blocks`
    blocks (the scheduler freed the blocks of rejected draft tokens since the runner last heard of the
    request) and the blocks it received this step are appended. `new_token_ids`: the tokens sampled
    for it since the runner last heard of it, which a pipeline stage before the last (it samples
    nothing) appends to its state."""

    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int  # tokens in the KV cache before this step (a check on the runner's state)
    num_kept_blocks: int = 0
    new_token_ids: list[int] = field(default_factory=list)


class GrammarBitmask:
    """The token masks of a step's constrained requests that sample (structured outputs).

    Row i belongs to `req_ids[i]` at `positions[i]`, the row of the request's verification it masks
    (0: its next token; j: the token after its first j drafts, speculative decoding): bit t % 32 of
    int32 word t // 32 set = token t allowed (xgrammar's and llguidance's layout). The masks are filled
    on the structured-output manager's thread while the step's forward runs; `bitmask()` waits for
    them. Pickling (to tensor-parallel workers) waits too and sends the array.
    """

    def __init__(self, req_ids: list[str], bitmask: Union[Future, np.ndarray], positions: Optional[list[int]] = None):
        self.req_ids = req_ids
        self.positions = positions if positions is not None else [0] * len(req_ids)
        self._bitmask = bitmask

    def bitmask(self) -> np.ndarray:
        """[len(req_ids), ceil(vocab / 32)] int32, once filled."""
        if isinstance(self._bitmask, Future):
            self._bitmask = self._bitmask.result()
        return self._bitmask

    def __getstate__(self) -> dict:
        return {"req_ids": self.req_ids, "positions": self.positions, "_bitmask": self.bitmask()}


@dataclass
class SchedulerOutput:
    """One model step.

    Attributes:
        scheduled_new_reqs: requests the runner learns about in this step.
        scheduled_cached_reqs: requests it already holds, with this step's new blocks.
        num_scheduled_tokens: req_id -> tokens computed for it in this step (a prompt chunk or 1),
            in schedule order; every scheduled request appears here.
        finished_req_ids: requests finished or aborted since the last step (drop their state).
        preempted_req_ids: requests preempted in this step (drop their state; they come back new).
        grammar_bitmask: the token masks of the constrained requests that sample in this step, or
            None (structured_output/manager.py).
        scheduled_spec_decode_tokens: req_id -> the draft tokens verified in this step (speculative
            decoding): they follow the request's last token, and its `num_scheduled_tokens` count them.
        spec_decode_req_ids: the requests the runner proposes drafts for after this step, if they
            sample in it (speculation is on for them in the next step).
    """

    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: list[CachedRequestData] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    grammar_bitmask: Optional[GrammarBitmask] = None
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    spec_decode_req_ids: set[str] = field(default_factory=set)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens
