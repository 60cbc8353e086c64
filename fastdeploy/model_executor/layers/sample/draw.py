"""Greedy argmax or one filtered random draw per row, in numpy: the reference of the compiled
`fd_top_k_top_p_min_p_sampling` op (custom_ops/cpu_ops/sampling.cc, shim ops/sampling.py).

Per row (logits already penalised and masked): temperature 0 is greedy, the first index of the
maximum. Otherwise w = exp(l / T - max(l / T)) (= p / p_max), w < min_p -> 0, then
- neither top-k nor top-p: the inverse CDF of w in token-id order (block sums first, then one block);
- else the tokens sorted by w (ties: lower id first), cut to top_k, then to the smallest prefix whose
  mass before each token is below top_p x the remaining mass (the top token always kept); the inverse
  CDF walks them in that order.
A draw never returns a token of weight 0, whatever its uniform number in [0, 1).
"""
import numpy as np

BLOCK = 1024  # inverse-CDF search: cumulative sums over blocks, then inside one block
# top-k/top-p candidates: tokens with p >= CANDIDATE_CUT x p_max, lowered until they provably hold
# the nucleus; sorting only those avoids sorting the vocabulary.
CANDIDATE_CUT = 1e-3


def sample_rows(logits: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
                min_p: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Token ids [rows] int64 for logits [rows, vocab] float32 (not modified); the other arguments are
    [rows] arrays (temperature 0 = greedy, top_k <= 0 and top_p = 1 and min_p = 0 = off, uniforms in [0, 1))."""
    tokens = np.empty(len(logits), np.int64)
    for r, row in enumerate(logits):
        t = temperature[r]
        if t > 0:
            tokens[r] = _sample_row(row / np.float32(t), int(top_k[r]), float(top_p[r]), float(min_p[r]),
                                    float(uniforms[r]))
        else:
            tokens[r] = int(np.argmax(row))
    return tokens


def _sample_row(logits_row: np.ndarray, top_k: int, top_p: float, min_p: float, u: float) -> int:
    """One random draw from logits_row [vocab] (already divided by temperature)."""
    weights = np.exp(logits_row - logits_row.max())  # p / p_max, float32
    if min_p > 0:
        weights[weights < min_p] = 0.0
    if top_k <= 0 and top_p >= 1:
        return _draw_full(weights, u)
    return _draw_filtered(weights, top_k, top_p, u)


def _draw_full(weights: np.ndarray, u: float) -> int:
    """Inverse-CDF draw over non-negative weights [vocab]; a zero weight is never drawn."""
    vocab = len(weights)
    full = vocab // BLOCK * BLOCK
    sums = weights[:full].reshape(-1, BLOCK).sum(axis=1, dtype=np.float64)
    if full < vocab:
        sums = np.append(sums, weights[full:].sum(dtype=np.float64))
    cdf = np.cumsum(sums)
    target = u * cdf[-1]
    block = min(int(np.searchsorted(cdf, target, side="right")), int(np.flatnonzero(sums)[-1]))
    inside = weights[block * BLOCK : (block + 1) * BLOCK]
    return block * BLOCK + _draw_in(inside.astype(np.float64), target - (cdf[block - 1] if block else 0.0))


def _draw_in(weights: np.ndarray, target: float) -> int:
    """Index i with cdf[i-1] <= target < cdf[i], clamped onto a non-zero weight."""
    cdf = np.cumsum(weights)
    i = int(np.searchsorted(cdf, max(target, 0.0), side="right"))
    return min(i, int(np.flatnonzero(weights)[-1]))


def _candidates(weights: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Token ids holding every token top-k/top-p could keep (weights = p / p_max)."""
    cut = CANDIDATE_CUT
    total = None
    while True:
        ids = np.flatnonzero(weights >= cut) if cut > 0 else np.flatnonzero(weights > 0)
        if cut == 0:
            return ids
        if top_k > 0:
            if len(ids) >= top_k:  # the k largest are all >= cut
                return ids
        else:
            total = weights.sum(dtype=np.float64) if total is None else total
            # tokens below the cut come after ids in sorted order, so once ids hold top_p of the
            # mass every token below the cut has mass_before >= top_p: none is in the nucleus
            if weights[ids].sum(dtype=np.float64) >= top_p * total:
                return ids
        cut = cut * 1e-3 if cut > 1e-12 else 0.0


def _draw_filtered(weights: np.ndarray, top_k: int, top_p: float, u: float) -> int:
    ids = _candidates(weights, top_k, top_p)  # ascending ids: the stable sort breaks ties by id
    order = ids[np.argsort(-weights[ids], kind="stable")]
    if top_k > 0:
        order = order[:top_k]
    values = weights[order].astype(np.float64)
    before = np.cumsum(values) - values
    # top-p renormalises what top-k kept: the k tokens, or every token (candidates may leave out a tail)
    kept_mass = values.sum() if top_k > 0 else weights.sum(dtype=np.float64)
    keep = before < top_p * kept_mass
    values = values[keep]
    return int(order[:len(values)][_draw_in(values, u * values.sum())])
