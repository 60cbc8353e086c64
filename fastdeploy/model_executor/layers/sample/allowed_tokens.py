"""allowed_token_ids at sampling time (vLLM's field): every token outside a request's list is banned.

The mask is built once per request (`disallowed_mask`, cached on the runner's request state) and
applied per step by filling -inf where it is True, one O(vocab) pass per such row; rows without a
list are not touched.
"""
import numpy as np


def disallowed_mask(allowed_token_ids: list[int], vocab_size: int) -> np.ndarray:
    """[vocab_size] bool, True at every token not in `allowed_token_ids` (ids checked against the
    vocabulary when the request was added)."""
    mask = np.ones(vocab_size, dtype=bool)
    mask[np.asarray(allowed_token_ids, dtype=np.int64)] = False
    return mask


def apply_allowed(logits: np.ndarray, masks: list) -> None:
    """Set logits [rows, vocab] to -inf where each (row, disallowed mask [vocab]) of `masks` is True, in place."""
    for row, mask in masks:
        np.putmask(logits[row], mask, -np.inf)
