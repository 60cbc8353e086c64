"""FastDeploy's built-in logits processors."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from fastdeploy.config import FDConfig
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.model_executor.layers.sample.logit_bias import LogitBias, apply_logit_bias, bias_arrays
from fastdeploy.model_executor.logits_processor.base import LogitsProcessor, LogitsRow

FIELD = "logits_processors_args['logit_bias']"


class LogitBiasLogitsProcessor(LogitsProcessor):
    """Adds `logits_processors_args["logit_bias"]` ({token id: bias}) to each request's logits.

    FastDeploy's processor: keys cast with int(), values with float() (a TypeError naming the key
    when a cast fails), no clamp; non-finite biases and ids outside the vocabulary are ValueErrors
    when the request is added. vLLM's `SamplingParams.logit_bias` does the same, clamped to [-100, 100].
    """

    def __init__(self, fd_config: FDConfig) -> None:
        self.bias: Optional[LogitBias] = None

    @classmethod
    def validate_params(cls, params: SamplingParams, fd_config: FDConfig) -> None:
        bias = _cast((params.logits_processors_args or {}).get("logit_bias"))
        vocab = fd_config.model_config.vocab_size
        bad = [t for t in bias if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"{FIELD} holds token id {bad[0]}, outside the vocabulary [0, {vocab})")

    def update_state(self, rows: list[LogitsRow]) -> None:
        self.bias = LogitBias.from_rows([(i, *bias_arrays(_cast(row.logits_processors_args.get("logit_bias"))))
                                         for i, row in enumerate(rows) if row.logits_processors_args.get("logit_bias")])

    def apply(self, logits: np.ndarray) -> None:
        if self.bias is not None:
            apply_logit_bias(logits, self.bias)


def _cast(bias) -> dict[int, float]:
    """{int(token): float(bias)} of the processor's argument (None: {})."""
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise TypeError(f"{FIELD} must be a dict {{token id: bias}}, got {type(bias).__name__}")
    out = {}
    for key, value in bias.items():
        try:
            token, number = int(key), float(value)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(f"{FIELD}: cannot cast {key!r}: {value!r} to a token id (int) and a bias (float)") from None
        if not math.isfinite(number):
            raise ValueError(f"{FIELD}[{key!r}] must be finite, got {value!r}")
        out[token] = number
    return out
