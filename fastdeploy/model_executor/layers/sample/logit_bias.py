"""Logit biases on a batch of logits, in place: a sparse scatter-add of (row, token, bias) triples.

For each triple, logits[row, token] += bias in float32. A row's tokens are distinct (they come
from one dict), so one fancy-indexed add is exact; only rows with a bias are touched. Used by
`SamplingParams.logit_bias` (worker/sampling_inputs.py) and by FastDeploy's built-in
`LogitBiasLogitsProcessor` (model_executor/logits_processor/builtin.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass
class LogitBias:
    """One step's biases: one entry per (row, token) pair."""

    rows: np.ndarray  # [m] int64
    token_ids: np.ndarray  # [m] int64
    values: np.ndarray  # [m] float32

    @classmethod
    def from_rows(cls, entries: list[tuple[int, np.ndarray, np.ndarray]]) -> Optional["LogitBias"]:
        """From (row, token ids [k] int64, biases [k] float32) per biased row; None when there is none."""
        entries = [e for e in entries if len(e[1])]
        if not entries:
            return None
        return cls(np.concatenate([np.full(len(ids), row, np.int64) for row, ids, _ in entries]),
                   np.concatenate([ids for _, ids, _ in entries]),
                   np.concatenate([values for _, _, values in entries]))


def bias_arrays(bias: dict) -> tuple[np.ndarray, np.ndarray]:
    """(token ids [k] int64, biases [k] float32) of a {token id: bias} dict."""
    return np.fromiter(bias.keys(), np.int64, len(bias)), np.fromiter(bias.values(), np.float32, len(bias))


def apply_logit_bias(logits: np.ndarray, bias: LogitBias) -> None:
    """logits [rows, vocab] float32 += bias at each (row, token), in place."""
    logits[bias.rows, bias.token_ids] += bias.values
