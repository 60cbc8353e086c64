"""What a model runner returns for one step (`ModelRunnerOutput`): plain ids and numpy arrays, so
it pickles and can come back from a worker process."""
from __future__ import annotations

from dataclasses import dataclass, field
import numpy as np

from fastdeploy.model_executor.layers.sample.logprobs import LogprobsArrays


@dataclass
class PromptLogprobsOutput:
    """Logprobs of prompt tokens scored in this step for one request.

    Attributes:
        positions: [m] prompt positions whose token was scored (each >= 1: the logits at position
            p - 1 score prompt token p).
        logprobs: the m positions' logprobs (raw).
    """

    positions: np.ndarray
    logprobs: LogprobsArrays


@dataclass
class ModelRunnerOutput:
    """The result of one step.

    Attributes:
        sampled_token_ids: req_id -> the tokens it gained in this step: one sampled token, or with
            speculative decoding the accepted drafts followed by one sampled token; only requests whose
            whole sequence is in the cache after this step sample (a prompt chunk that leaves tokens
            samples none).
        logprobs: req_id -> the logprobs of those tokens (one row each), for requests that asked.
        prompt_logprobs: req_id -> prompt positions scored this step, for requests that asked.
        pooler_output: req_id -> a pooling request's output (float32 array, layers/pooler.py), in the
            step that computed its whole prompt.
        num_draft_tokens: req_id -> the drafts verified for it in this step (speculative decoding; the
            accepted ones are len(sampled_token_ids[req_id]) - 1).
        draft_token_ids: req_id -> the drafts proposed for its next step (speculative decoding).
    """

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, LogprobsArrays] = field(default_factory=dict)
    prompt_logprobs: dict[str, PromptLogprobsOutput] = field(default_factory=dict)
    pooler_output: dict[str, np.ndarray] = field(default_factory=dict)
    num_draft_tokens: dict[str, int] = field(default_factory=dict)
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
