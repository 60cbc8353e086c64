"""PoolingParams: what one request of a pooling model asks for (vLLM's `PoolingParams`). Data type only.

The LLM method sets `task` ("embed", "classify", "score", "reward"); the engine resolves the None fields
from the model's pooler (config.py PoolerConfig) with `resolve`, which also checks them against the model.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

PARAMS_OF_TASK = {  # which fields a task reads; setting another one is a ValueError
    "embed": ("dimensions", "normalize"),
    "classify": ("activation",),
    "score": ("activation",),
    "reward": (),
}


@dataclass
class PoolingParams:
    """Attributes:
        dimensions: Matryoshka truncation of an embedding: its first `dimensions` values, then
            L2-normalised again (when normalize). Only for a model that declares Matryoshka support
            (config.json `is_matryoshka` or `matryoshka_dimensions`); ValueError otherwise.
        normalize: L2-normalise the embedding; None: the model's pooler decides (sentence-transformers'
            Normalize module, else True for embedding models).
        activation: softmax over the labels (sigmoid for a one-label model) of classification and score
            outputs; None: True.
        truncate_prompt_tokens: keep only the last k tokens of a longer prompt (-1: max_model_len);
            None: a prompt longer than max_model_len is a ValueError.
        task: set by the LLM method ("embed", "classify", "score", "reward"); a user setting that
            disagrees with the method is a ValueError.
    """

    dimensions: Optional[int] = None
    normalize: Optional[bool] = None
    activation: Optional[bool] = None
    truncate_prompt_tokens: Optional[int] = None
    task: Optional[str] = None

    def __post_init__(self) -> None:
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise ValueError(f"dimensions must be an int >= 1 or None, got {self.dimensions!r}")
        for name in ("normalize", "activation"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True, False or None, got {getattr(self, name)!r}")
        k = self.truncate_prompt_tokens
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or (k < 1 and k != -1)):
            raise ValueError(f"truncate_prompt_tokens must be an int >= 1, -1 (max_model_len) or None, got {k!r}")
        if self.task is not None and self.task not in PARAMS_OF_TASK:
            raise ValueError(f"task must be one of {list(PARAMS_OF_TASK)} or None, got {self.task!r}")

    def clone(self, **changes) -> "PoolingParams":
        return dataclasses.replace(self, **changes)

    def for_task(self, task: str) -> "PoolingParams":
        """A copy for `task`; ValueError when the params name another task or set a field the task does
        not read (e.g. dimensions for classify)."""
        if self.task is not None and self.task != task:
            raise ValueError(f"pooling_params.task={self.task!r}, but this call runs task {task!r}")
        unused = [name for name in ("dimensions", "normalize", "activation")
                  if getattr(self, name) is not None and name not in PARAMS_OF_TASK[task]]
        if unused:
            raise ValueError(f"task {task!r} reads {list(PARAMS_OF_TASK[task]) or 'no fields'} of PoolingParams, "
                             f"not {unused}")
        return self.clone(task=task)

    def resolve(self, pooler, hidden_size: int) -> "PoolingParams":
        """A copy with None fields taken from `pooler` (config.py PoolerConfig), checked against the model:
        ValueError for `dimensions` on a model without Matryoshka support, outside its sizes, or above
        hidden_size."""
        dims = self.dimensions if self.dimensions is not None else pooler.dimensions
        if self.dimensions is not None:
            allowed = pooler.matryoshka_dimensions
            if allowed == ():
                raise ValueError(f"dimensions={self.dimensions}: this model does not declare Matryoshka support "
                                 "(config.json is_matryoshka / matryoshka_dimensions), so its embeddings "
                                 "cannot be truncated")
            if allowed is not None and self.dimensions not in allowed:
                raise ValueError(f"dimensions={self.dimensions}: this model supports the Matryoshka dimensions "
                                 f"{list(allowed)} only")
            if self.dimensions > hidden_size:
                raise ValueError(f"dimensions={self.dimensions} exceeds the model's hidden size {hidden_size}")
        return self.clone(
            dimensions=dims,
            normalize=pooler.normalize if self.normalize is None else self.normalize,
            activation=pooler.activation if self.activation is None else self.activation,
        )
