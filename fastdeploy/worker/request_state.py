"""The model runner's own state of one request, built from `NewRequestData` and kept up to date
by the per-step diffs of `SchedulerOutput` (engine/sched/output.py) and by the tokens it samples."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from fastdeploy.engine.pooling_params import PoolingParams
from fastdeploy.engine.request import TokenSequence
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.sched.output import NewRequestData


@dataclass(eq=False)
class CachedRequestState(TokenSequence):
    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    sampling_params: Optional[SamplingParams]  # None for a pooling request
    positions: np.ndarray  # [num_prompt_tokens] or [3, num_prompt_tokens] int64
    position_delta: int  # a token after the prompt at index i has position i + position_delta
    block_ids: list[int]
    num_computed_tokens: int
    eos_token_ids: frozenset
    bad_words_token_ids: list
    index: int
    token_type_ids: Optional[np.ndarray]
    wants_prompt_logprobs: bool
    num_prompt_logprobs_done: int
    mm_features: list = field(default_factory=list)  # MultiModalFeature per image/video, in prompt order
    pooling_params: Optional[PoolingParams] = None  # a pooling model's request: pooled, never sampled
    # encoder output [length, hidden] of each item being prefilled, by index in mm_features (worker/multimodal.py)
    encoder_outputs: dict = field(default_factory=dict, repr=False)
    prompt_unique: Optional[np.ndarray] = field(default=None, repr=False)  # sorted unique prompt ids, for penalties
    # built on the first step that samples (worker/sampling_inputs.py), kept until the request leaves:
    logit_bias_arrays: Optional[tuple] = field(default=None, repr=False)  # (ids [k] int64, biases [k] float32)
    disallowed_mask: Optional[np.ndarray] = field(default=None, repr=False)  # [vocab] bool, allowed_token_ids
    num_draft_computed_tokens: int = 0  # tokens in a draft model's KV cache (spec_decode/draft_model.py)

    @classmethod
    def from_new(cls, new: NewRequestData) -> "CachedRequestState":
        return cls(
            req_id=new.req_id,
            prompt_token_ids=new.prompt_token_ids,
            output_token_ids=list(new.output_token_ids),
            sampling_params=new.sampling_params,
            positions=new.positions,
            position_delta=new.position_delta,
            block_ids=list(new.block_ids),
            num_computed_tokens=new.num_computed_tokens,
            eos_token_ids=new.eos_token_ids,
            bad_words_token_ids=new.bad_words_token_ids,
            index=new.index,
            token_type_ids=new.token_type_ids,
            wants_prompt_logprobs=new.wants_prompt_logprobs,
            num_prompt_logprobs_done=new.num_prompt_logprobs_done,
            mm_features=list(new.mm_features),
            pooling_params=new.pooling_params,
        )

    def positions_between(self, start: int, end: int) -> np.ndarray:
        """Positions of tokens [start, end): [end - start], or [3, end - start] for M-RoPE."""
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.positions[..., start:end]
        generated = np.arange(max(start, num_prompt), end, dtype=np.int64) + self.position_delta
        if self.positions.ndim == 2:
            generated = np.broadcast_to(generated, (self.positions.shape[0], len(generated)))
        if start >= num_prompt:
            return generated
        return np.concatenate([self.positions[..., start:num_prompt], generated], axis=-1)

    def token_types_between(self, start: int, end: int) -> np.ndarray:
        """Modality ids of tokens [start, end) [end - start] int64 (generated tokens are text, 0)."""
        types = np.zeros(end - start, dtype=np.int64)
        if self.token_type_ids is not None and start < self.num_prompt_tokens:
            prompt_part = self.token_type_ids[start : min(end, self.num_prompt_tokens)]
            types[: len(prompt_part)] = prompt_part
        return types
