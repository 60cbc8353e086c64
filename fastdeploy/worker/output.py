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
        sampled_token_ids: req_id -> the token sampled for it; only requests whose whole sequence
            is in the cache after this step sample (a prompt chunk that leaves tokens samples none).
        logprobs: req_id -> the sampled position's logprobs, for requests that asked for them.
        prompt_logprobs: req_id -> prompt positions scored this step, for requests that asked.
        pooler_output: req_id -> a pooling request's output (float32 array, layers/pooler.py), in the
            step that computed its whole prompt.
    """

    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, LogprobsArrays] = field(default_factory=dict)
    prompt_logprobs: dict[str, PromptLogprobsOutput] = field(default_factory=dict)
    pooler_output: dict[str, np.ndarray] = field(default_factory=dict)
