"""The logits-processor interface: user code that edits a step's logit rows before the draw.

FastDeploy's shape (`fastdeploy.model_executor.logits_processor.LogitsProcessor`: built from the
FDConfig, `update_state` then `apply` every step), adapted to this engine: the state arrives as
one `LogitsRow` per logit row instead of FastDeploy's slot arrays (`share_inputs`), and the logits
are the numpy rows the sampler works on (layers/sample/sampler.py), edited in place.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple, Optional

import numpy as np

from fastdeploy.config import FDConfig
from fastdeploy.engine.sampling_params import SamplingParams


class LogitsRow(NamedTuple):
    """The request behind one logit row of a step, as a processor sees it (read only)."""

    req_id: str  # one completion's id (a prompt with n > 1 has n of them)
    sampling_params: SamplingParams  # the request's resolved parameters
    logits_processors_args: dict  # sampling_params.logits_processors_args, {} when None
    prompt_token_ids: list  # [prompt length] int
    output_token_ids: list  # [tokens generated so far] int; the row samples the next one


class LogitsProcessor(ABC):
    """Base class of a logits processor, built-in or the user's.

    Give its class to `LLM(logits_processors=[...])`: a bare name is a built-in of this package
    (`"LogitBiasLogitsProcessor"`), `"package.module:ClassName"` a class of yours. Processors run in
    the order given, every step, after the penalties and `SamplingParams.logit_bias` and before the
    bans (min_tokens, bad words, allowed_token_ids) and temperature. They live where sampling happens:
    the model runner (tensor-parallel rank 0), one instance per class, built from the FDConfig.

    A request passes its arguments in `SamplingParams(logits_processors_args={...})`; each processor
    reads its own keys and leaves alone the rows that do not use it. Every step, for the rows that
    sample a token (a prompt chunk that does not finish the prompt samples nothing):
      1. `update_state(rows)`: one LogitsRow per logit row, in row order;
      2. `apply(logits)`: logits [len(rows), vocab] float32 numpy, edited in place; -inf bans a token.
    `validate_params` checks a request's arguments when it is added (before anything is queued).

    Raises: an exception from `update_state` or `apply` fails the step (the engine rolls it back
    and the call raises it); from `validate_params`, the request is refused.
    """

    def __init__(self, fd_config: FDConfig) -> None:
        """Called once, when the engine starts; `fd_config` is the engine's settings (e.g.
        `fd_config.model_config.vocab_size`)."""

    @classmethod
    def validate_params(cls, params: SamplingParams, fd_config: FDConfig) -> None:
        """Raise ValueError / TypeError if `params` (its `logits_processors_args`) is invalid for
        this processor. Called in the engine's process, on the class, when the request is added."""

    @abstractmethod
    def update_state(self, rows: list[LogitsRow]) -> None:
        """Take this step's rows (row i of the next `apply`'s logits is `rows[i]`)."""

    @abstractmethod
    def apply(self, logits: np.ndarray) -> Optional[np.ndarray]:
        """Edit logits [rows, vocab] float32 in place and return None. FastDeploy-style code that
        returns a new array of the same shape works too: it is copied into the rows."""


def apply_processors(logits: np.ndarray, processors: list) -> None:
    """Run each processor's `apply` on logits [rows, vocab] in order, in place (a returned new array
    is copied in; ValueError naming the processor when its shape differs)."""
    for processor in processors:
        out = processor.apply(logits)
        if out is not None and out is not logits:
            if np.shape(out) != logits.shape:
                raise ValueError(f"{type(processor).__name__}.apply returned shape {np.shape(out)}, the logits "
                                 f"are {logits.shape}")
            logits[...] = out
