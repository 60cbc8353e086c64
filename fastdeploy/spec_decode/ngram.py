"""Prompt-lookup drafts (n-gram matching): the tokens that followed an earlier occurrence of the
sequence's last n tokens.

For n from `max_n` down to `min_n`, the last n tokens of prompt + output are looked for earlier in
the same sequence; the first (earliest) occurrence wins and the up to k tokens after it are the
drafts. The longest n that matches decides. This is vLLM's ngram proposer's rule (longest n-gram,
earliest occurrence; arXiv 2304.04487, "Inference with Reference") and llama.cpp's prompt-lookup
decoding's; FastDeploy's `ngram_match` looks in the prompt first, which the earliest occurrence
also does when the match is in the prompt.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(token_ids: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k draft tokens for token_ids [num_tokens] int64 (prompt + output), [] when no n-gram of
    length min_n..max_n ending at the last token occurred before."""
    num_tokens = len(token_ids)
    for n in range(min(max_n, num_tokens - 1), min_n - 1, -1):
        suffix = token_ids[num_tokens - n:]
        windows = sliding_window_view(token_ids[: num_tokens - 1], n)  # starts 0 .. num_tokens - 1 - n
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[0]) + n
            return token_ids[start : start + k].tolist()
    return []
