"""Sampling shims: the compiled ops of custom_ops/cpu_ops/penalties.cc and sampling.cc, or their numpy
references, layers/sample/penalties.py and layers/sample/draw.py.

Both take numpy arrays (the sampler works on a zero-copy numpy view of the logits) and hand them to
the ops without copying the logits. The compiled draw gives the reference's token for the same
uniform number except where float rounding moves a CDF or filter boundary across it: its weights
(its own exp, x * (1 / T)) and sums differ from numpy's by a few float32 ulps.
"""
import numpy as np

from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.sample.draw import sample_rows
from fastdeploy.model_executor.layers.sample.penalties import PenaltyInputs, apply_penalties
from fastdeploy.model_executor.ops.loader import compiled_op


def apply_penalties_(logits: np.ndarray, penalties: PenaltyInputs) -> None:
    """Repetition, frequency and presence penalties on logits [rows, vocab] float32, in place, at the
    (row, token) pairs of `penalties` (each pair once, as `seen_tokens` gives them).

    Reference: `penalties.apply_penalties` (FastDeploy's get_token_penalty_multi_scores). A
    non-contiguous `logits` runs the reference (the op writes through the array's buffer).
    """
    op = compiled_op("fd_apply_penalties_")
    if op is None or not logits.flags.c_contiguous:
        apply_penalties(logits, penalties)
        return
    entries = np.stack([penalties.rows, penalties.token_ids], axis=1).astype(np.int64, copy=False)  # [m, 2]
    params = np.stack([penalties.repetition, penalties.frequency, penalties.presence], axis=1)  # [rows, 3]
    op(as_paddle(logits), as_paddle(entries),
       as_paddle(np.asarray(penalties.output_counts, np.float32)),
       as_paddle(params.astype(np.float32, copy=False)))


def top_k_top_p_min_p_sampling(logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
                               min_p: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """One token id per row: token ids [rows] int64 from logits [rows, vocab] float32 (not modified).

    Per row, [rows] arrays: temperature (0 = greedy argmax, ties to the lowest id), top_k (<= 0 = off),
    top_p in (0, 1] (1 = off), min_p in [0, 1] (0 = off), uniforms in [0, 1) (the row's draw).
    Reference: `draw.sample_rows` (the rules are in layers/sample/draw.py).
    """
    op = compiled_op("fd_top_k_top_p_min_p_sampling")  # greedy rows too: its rows run on the engine's threads
    if op is None:
        if not (temperature > 0).any():  # greedy rows only: one argmax pass
            return np.argmax(logits, axis=1).astype(np.int64, copy=False)
        return sample_rows(logits, temperature, top_k, top_p, min_p, uniforms)
    params = np.stack([temperature, top_k, top_p, min_p, uniforms], axis=1).astype(np.float64)  # [rows, 5]
    return op(as_paddle(logits), as_paddle(params)).numpy()
