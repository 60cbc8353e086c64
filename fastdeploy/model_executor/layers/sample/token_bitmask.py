"""A packed token bitmask on logit rows (structured outputs), in numpy: the reference of the compiled
`fd_apply_token_bitmask_` op (custom_ops/cpu_ops/token_bitmask.cc, shim ops/token_bitmask.py).

Layout (xgrammar's and llguidance's): row i of bitmask [m, words] int32 masks logits row indices[i];
bit t % 32 of word t // 32 set = token t allowed. Every other token of the row (tokens at or past
32 * words included) becomes -inf; allowed logits are untouched.
"""
import numpy as np


def allowed_tokens(bitmask: np.ndarray, vocab: int) -> np.ndarray:
    """[m, vocab] bool: token t of row i allowed, from bitmask [m, words] int32."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask, dtype="<i4").view(np.uint8), axis=1, bitorder="little")
    allowed = np.zeros((bitmask.shape[0], vocab), dtype=bool)
    width = min(vocab, bits.shape[1])
    allowed[:, :width] = bits[:, :width].astype(bool)
    return allowed


def apply_token_bitmask(logits: np.ndarray, bitmask: np.ndarray, indices: np.ndarray) -> None:
    """Set logits [rows, vocab] float32 to -inf, in place, where bitmask row i disallows a token of row indices[i]."""
    allowed = allowed_tokens(bitmask, logits.shape[1])
    for i, row in enumerate(np.asarray(indices, dtype=np.int64)):
        logits[row, ~allowed[i]] = -np.inf
