"""The outputs of pooling models (FastDeploy's and vLLM's `PoolingRequestOutput` family). Data types only.

`PoolingOutput.data` is the pooler's float32 numpy array; the task's output class reads it the way
vLLM's does: `EmbeddingOutput.embedding` (list of floats), `ClassificationOutput.probs`,
`ScoringOutput.score`, `RewardOutput.score` (one value per prompt token).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from fastdeploy.engine.request import RequestMetrics


@dataclass
class PoolingOutput:
    """Attributes:
        data: float32 numpy array: [dimensions] for an embedding, [num_labels] for classification and
            scores, [num_tokens, num_labels] for rewards.
    """

    data: np.ndarray


class EmbeddingOutput(PoolingOutput):
    @property
    def embedding(self) -> list[float]:
        """The embedding as a list of floats (L2-normalised unless PoolingParams.normalize=False)."""
        return self.data.tolist()

    @property
    def hidden_size(self) -> int:
        return len(self.data)


class ClassificationOutput(PoolingOutput):
    @property
    def probs(self) -> list[float]:
        """Per-label probabilities (softmax; sigmoid for one label), or logits with activation=False."""
        return self.data.tolist()

    @property
    def num_classes(self) -> int:
        return len(self.data)


class ScoringOutput(PoolingOutput):
    @property
    def score(self) -> float:
        """The pair's score: a cross-encoder's probability (its logit with activation=False), or the cosine
        similarity of two embeddings."""
        return float(self.data.reshape(-1)[0])


class RewardOutput(PoolingOutput):
    @property
    def score(self) -> list:
        """The reward head's output at every prompt token (a list of floats for a one-label head, else a list
        of lists); a whole text's reward is the last entry."""
        data = self.data[:, 0] if self.data.shape[-1] == 1 else self.data
        return data.tolist()


@dataclass
class PoolingRequestOutput:
    """The result of one prompt of a pooling call, returned in input order.

    Attributes:
        request_id: the engine's id of the request.
        prompt: the prompt text (None for token input; "text_1 | text_2" pairs keep text_1).
        prompt_token_ids: the token ids the model read (special tokens included).
        outputs: the pooler's output (the task's PoolingOutput subclass).
        finished: always True (pooling runs one prefill).
        metrics: timings.
        error_code: 200, or 500 when the request failed at run time.
        error_msg: what went wrong, or None.
    """

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: PoolingOutput
    finished: bool = True
    metrics: Optional[RequestMetrics] = None
    error_code: int = 200
    error_msg: Optional[str] = None


class EmbeddingRequestOutput(PoolingRequestOutput):
    """`LLM.embed`'s output: `outputs.embedding`."""


class ClassificationRequestOutput(PoolingRequestOutput):
    """`LLM.classify`'s output: `outputs.probs`."""


class ScoringRequestOutput(PoolingRequestOutput):
    """`LLM.score`'s output: `outputs.score`."""


class RewardRequestOutput(PoolingRequestOutput):
    """`LLM.reward`'s output: `outputs.score`, per token."""


OUTPUT_CLASSES = {  # task -> (request output class, its outputs class)
    "embed": (EmbeddingRequestOutput, EmbeddingOutput),
    "classify": (ClassificationRequestOutput, ClassificationOutput),
    "score": (ScoringRequestOutput, ScoringOutput),
    "reward": (RewardRequestOutput, RewardOutput),
}
