"""Token sampling for one step: penalties and masks, then greedy argmax or a filtered random draw.

Order (FastDeploy's sampler; vLLM's is the same): penalties (penalties.py) -> bans (EOS under
min_tokens, bad words) -> logits / temperature -> softmax -> min-p (drop tokens below min_p x the
top probability) -> top-k -> top-p (smallest prefix of the sorted, renormalised distribution whose
mass reaches top_p; the top token always kept) -> one draw by inverse CDF.
Temperature 0 is greedy: the exact argmax of the processed logits, ties to the lowest token id.

Each draw uses one uniform number per row, from the request's own generator when it is seeded
(see ModelRunner), so a seeded request samples the same tokens in any batch.

The work is done in numpy on a zero-copy view (DLPack) of the Paddle logits: for these shapes
([rows, vocab ~50k], float32) Paddle's CPU kernels are far slower (log_softmax [32, 49152] takes
seconds, topk(1024) 28 ms, against ~1 ms here), and every step below is O(vocab) per row.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np
from fastdeploy.model_executor.layers.sample.logprobs import compute_logprobs
from fastdeploy.model_executor.layers.sample.penalties import PenaltyInputs, apply_bans, apply_penalties

BLOCK = 1024  # inverse-CDF search: cumulative sums over blocks, then inside one block
# top-k/top-p candidates: tokens with p >= CANDIDATE_CUT x p_max, lowered until they provably hold
# the nucleus; sorting only those avoids sorting the vocabulary.
CANDIDATE_CUT = 1e-3
RAW = "raw_logprobs"  # the other mode: "processed_logprobs"


@dataclass
class SamplingMetadata:
    """Per-step sampling inputs, one row per request that samples a token this step."""

    temperature: np.ndarray  # [rows] float, 0 = greedy
    top_k: np.ndarray  # [rows] int, 0 = off
    top_p: np.ndarray  # [rows] float in (0, 1]
    min_p: np.ndarray  # [rows] float in [0, 1]
    uniforms: np.ndarray  # [rows] float64 in [0, 1): the draw of each row
    banned: list  # (row, token ids) pairs masked this step (EOS under min_tokens, bad words)
    penalties: Optional[PenaltyInputs] = None  # None: no row has a penalty
    num_logprobs: Optional[np.ndarray] = None  # [rows] int, -1 = no logprobs for that row
    logprobs_mode: str = RAW  # RAW: before penalties/temperature; "processed_logprobs": after them


@dataclass
class SamplerOutput:
    token_ids: np.ndarray  # [rows] int64
    logprobs: list  # [rows] LogprobsArrays (m = 1) or None


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
    keep = before < top_p * values.sum()
    values = values[keep]
    return int(order[:len(values)][_draw_in(values, u * values.sum())])


def _sample_row(logits_row: np.ndarray, top_k: int, top_p: float, min_p: float, u: float) -> int:
    """One random draw from logits_row [vocab] (already divided by temperature)."""
    weights = np.exp(logits_row - logits_row.max())  # p / p_max, float32
    if min_p > 0:
        weights[weights < min_p] = 0.0
    if top_k <= 0 and top_p >= 1:
        return _draw_full(weights, u)
    return _draw_filtered(weights, top_k, top_p, u)


def sample(logits, md: SamplingMetadata) -> SamplerOutput:
    """Token ids (and requested logprobs) for logits [rows, vocab] float32 (a paddle.Tensor or a
    numpy array); the logits are overwritten."""
    x = logits if isinstance(logits, np.ndarray) else np.from_dlpack(logits)  # [rows, vocab], in place
    rows = x.shape[0]
    wants = np.flatnonzero(md.num_logprobs >= 0) if md.num_logprobs is not None else np.zeros(0, np.int64)
    raw = x[wants] if len(wants) and md.logprobs_mode == RAW else None  # fancy index: a copy
    if md.penalties is not None:
        apply_penalties(x, md.penalties)
    apply_bans(x, md.banned)
    tokens = np.empty(rows, np.int64)
    for r in range(rows):
        t = md.temperature[r]
        if t > 0:
            x[r] /= np.float32(t)
            tokens[r] = _sample_row(x[r], int(md.top_k[r]), float(md.top_p[r]), float(md.min_p[r]),
                                    float(md.uniforms[r]))
        else:
            tokens[r] = int(np.argmax(x[r]))
    logprobs = [None] * rows
    if len(wants):
        source = raw if raw is not None else x[wants]  # [len(wants), vocab]
        for i, r in enumerate(wants):  # row by row: small temporaries stay in cache
            logprobs[r] = compute_logprobs(source[i : i + 1], tokens[r : r + 1], int(md.num_logprobs[r]))
    return SamplerOutput(tokens, logprobs)
