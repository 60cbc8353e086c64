"""Log-probabilities of chosen tokens and the top-k alternatives, from logits rows.

logprob = l_t - logsumexp(l) (natural log). rank = 1 + the number of tokens with a strictly larger
logit (vLLM's rank counts ties against the token; they differ only on exact ties).
"""
from dataclasses import dataclass

import numpy as np

MARGIN = 4.0  # logits within this of the maximum are top-k candidates first
MAX_CANDIDATES = 4096


@dataclass
class LogprobsArrays:
    """Logprobs of m positions."""

    top_ids: np.ndarray  # [m, k] int64, most likely first (ties: lower id first)
    top_logprobs: np.ndarray  # [m, k] float32
    top_ranks: np.ndarray  # [m, k] int64
    token_logprobs: np.ndarray  # [m] float32 logprob of the chosen/actual token
    token_ranks: np.ndarray  # [m] int64


def compute_logprobs(logits: np.ndarray, token_ids: np.ndarray, k: int) -> LogprobsArrays:
    """Logprobs of `token_ids` [m] (m >= 1) under logits [m, vocab] float32, with the top k of each row."""
    m, vocab = logits.shape
    k = min(k, vocab)
    top = logits.max(axis=1, keepdims=True)  # [m, 1]
    shifted = logits - top
    lse = top[:, 0] + np.log(np.exp(shifted, out=shifted).sum(axis=1, dtype=np.float64))  # [m]
    chosen = logits[np.arange(m), token_ids]  # [m]
    token_ranks = 1 + np.count_nonzero(logits > chosen[:, None], axis=1)
    if k == 0:
        top_ids = np.zeros((m, 0), np.int64)
    elif k == vocab:
        top_ids = np.argsort(-logits, axis=1, kind="stable")
    else:
        top_ids = np.stack([_top_k_ids(row, k) for row in logits])
    top_values = np.take_along_axis(logits, top_ids, axis=1)  # [m, k] descending
    # descending rows: tokens strictly above v are exactly those before v's first occurrence
    top_ranks = 1 + np.stack([np.searchsorted(-row, -row, side="left") for row in top_values])
    return LogprobsArrays(
        top_ids=top_ids.astype(np.int64),
        top_logprobs=(top_values - lse[:, None]).astype(np.float32),
        top_ranks=top_ranks.astype(np.int64),
        token_logprobs=(chosen - lse).astype(np.float32),
        token_ranks=token_ranks.astype(np.int64),
    )


def _top_k_ids(row: np.ndarray, k: int) -> np.ndarray:
    """The k largest of row [vocab], largest first, ties by lower id. Sorts only candidates: the
    tokens within MARGIN of the maximum when there are enough of them and not too many (the usual
    case for a language model), else the tokens at or above the k-th largest value."""
    ids = np.flatnonzero(row >= row.max() - MARGIN)  # ascending ids
    if not k <= len(ids) <= MAX_CANDIDATES:
        kth = np.partition(row, len(row) - k)[len(row) - k]
        ids = np.flatnonzero(row >= kth)
    return ids[np.argsort(-row[ids], kind="stable")[:k]]
