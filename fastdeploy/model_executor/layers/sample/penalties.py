"""Penalties and token masks on a batch of logits, in place: FastDeploy's
`get_token_penalty_multi_scores` (its custom_ops/gpu_ops/token_penalty_multi_scores.cu; ours for CUDA is
custom_ops/gpu_ops/penalty_op.cu) on CPU.

For row r and every token t seen in r's prompt or output (sparse: only those tokens are touched):
    l = l / repetition[r] if l > 0 else l * repetition[r]        (prompt and output tokens)
    l = l - frequency[r] * count_t - presence[r] * [count_t > 0]  (count_t: occurrences in output)
Masks (`apply_bans`) then set banned tokens to -inf: EOS and stop tokens under min_tokens, bad words.
"""
from dataclasses import dataclass

import numpy as np


@dataclass
class PenaltyInputs:
    """Sparse penalty inputs of one step: one entry per (row, token seen by that row)."""

    rows: np.ndarray  # [m] int64 row of each entry
    token_ids: np.ndarray  # [m] int64
    output_counts: np.ndarray  # [m] float32 occurrences in the row's output (0: prompt only)
    repetition: np.ndarray  # [rows] float32, 1 = off
    frequency: np.ndarray  # [rows] float32, 0 = off
    presence: np.ndarray  # [rows] float32, 0 = off


def seen_tokens(prompt_unique: np.ndarray, output_ids: list) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, output counts) of every token in the prompt or the output, each once.

    prompt_unique: sorted unique prompt token ids (computed once per request).
    """
    out_ids, out_counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
    prompt_only = np.setdiff1d(prompt_unique, out_ids, assume_unique=True)
    ids = np.concatenate([out_ids, prompt_only])
    counts = np.concatenate([out_counts, np.zeros(len(prompt_only), np.int64)]).astype(np.float32)
    return ids, counts


def apply_penalties(logits: np.ndarray, p: PenaltyInputs) -> None:
    """Penalise logits [rows, vocab] float32 in place."""
    values = logits[p.rows, p.token_ids]  # [m]
    rep = p.repetition[p.rows]
    values = np.where(values > 0, values / rep, values * rep)
    values -= p.frequency[p.rows] * p.output_counts + p.presence[p.rows] * (p.output_counts > 0)
    logits[p.rows, p.token_ids] = values


def apply_bans(logits: np.ndarray, banned: list) -> None:
    """Set logits [rows, vocab] to -inf at each (row, token ids) pair of `banned`, in place."""
    for row, ids in banned:
        logits[row, ids] = -np.inf
