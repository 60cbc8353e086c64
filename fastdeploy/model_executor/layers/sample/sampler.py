"""Token sampling for one step: greedy argmax or temperature / min-p / top-k / top-p sampling.

Order, as FastDeploy's sampler and vLLM's: logits / temperature -> softmax -> min-p (drop tokens
below min_p x the top probability) -> top-k -> top-p (smallest prefix of the sorted, renormalised
distribution whose mass reaches top_p; the top token is always kept) -> one draw by inverse CDF.
The draw uses one uniform number per request, taken from the request's own generator when it has
a seed (seeded by (seed, step)), so a seeded request samples the same tokens in any batch.
Temperature 0 is greedy: the exact argmax of the logits, ties to the lowest token id.
"""
from dataclasses import dataclass

import numpy as np
import paddle
import paddle.nn.functional as F

# Candidates taken with top-k before falling back to a full sort for top-p rows without top_k:
# sorting a 50k vocabulary on CPU costs ~20x a top-1024.
FIRST_CANDIDATES = 1024


@dataclass
class SamplingMetadata:
    """Per-step sampling inputs, one row per request that samples a token this step."""

    temperature: np.ndarray  # [rows] float, 0 = greedy
    top_k: np.ndarray  # [rows] int, 0 = off
    top_p: np.ndarray  # [rows] float in (0, 1]
    min_p: np.ndarray  # [rows] float in [0, 1]
    uniforms: np.ndarray  # [rows] float64 in [0, 1): the draw of each row
    banned: list  # (row, token ids) pairs masked this step (EOS under min_tokens)


def _apply_bans(logits: paddle.Tensor, banned: list) -> paddle.Tensor:
    if not banned:
        return logits
    rows = np.concatenate([np.full(len(ids), row, np.int64) for row, ids in banned])
    cols = np.concatenate([np.asarray(ids, np.int64) for _, ids in banned])
    values = paddle.full([len(rows)], float("-inf"), dtype=logits.dtype)
    return paddle.index_put(logits, (paddle.to_tensor(rows), paddle.to_tensor(cols)), values)


def _candidates(probs: paddle.Tensor, top_k: np.ndarray, top_p: np.ndarray):
    """Sorted (probs, token ids) [rows, K] holding every token top-k/top-p could keep."""
    vocab = probs.shape[1]
    limit = np.where(top_k > 0, np.minimum(top_k, vocab), vocab)
    k = int(min(vocab, max(limit[limit < vocab].max(initial=1), FIRST_CANDIDATES)))
    values, ids = paddle.topk(probs, k, axis=-1)
    if k < vocab:
        mass = values.sum(axis=-1).numpy() / probs.sum(axis=-1).numpy()
        if np.any((limit > k) & (mass < top_p)):  # a nucleus reaches past the candidates
            values, ids = paddle.topk(probs, vocab, axis=-1)
    return values, ids


def _draw(weights: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw per row over non-negative weights [rows, n]; zero weights never drawn."""
    cdf = np.cumsum(weights, axis=-1, dtype=np.float64)
    target = uniforms * cdf[:, -1]
    return np.argmax(cdf > target[:, None], axis=-1)


def sample_random(logits: paddle.Tensor, md: SamplingMetadata, rows: np.ndarray) -> np.ndarray:
    """Sampled token ids for `rows` of logits [rows_all, vocab]."""
    temperature = md.temperature[rows]
    x = paddle.gather(logits, paddle.to_tensor(rows)) / paddle.to_tensor(temperature[:, None].astype(np.float32))
    probs = F.softmax(x, axis=-1)  # [r, vocab]
    min_p = md.min_p[rows]
    if np.any(min_p > 0):
        threshold = probs.max(axis=-1, keepdim=True) * paddle.to_tensor(min_p[:, None].astype(np.float32))
        probs = paddle.where(probs >= threshold, probs, paddle.zeros_like(probs))
    top_k, top_p = md.top_k[rows], md.top_p[rows]
    if not np.any(top_k > 0) and not np.any(top_p < 1):
        return _draw(probs.numpy(), md.uniforms[rows])
    values, ids = _candidates(probs, top_k, top_p)
    values, ids = values.numpy().astype(np.float64), ids.numpy()
    rank = np.arange(values.shape[1])[None, :]
    values = np.where(rank < np.where(top_k > 0, top_k, values.shape[1])[:, None], values, 0.0)
    values /= values.sum(axis=-1, keepdims=True)
    mass_before = np.cumsum(values, axis=-1) - values
    values = np.where(mass_before < top_p[:, None], values, 0.0)
    choice = _draw(values, md.uniforms[rows])
    return ids[np.arange(len(rows)), choice]


def sample(logits: paddle.Tensor, md: SamplingMetadata) -> np.ndarray:
    """Token ids [rows] for logits [rows, vocab] (float32)."""
    logits = _apply_bans(logits, md.banned)
    tokens = paddle.argmax(logits, axis=-1).numpy().astype(np.int64)
    random_rows = np.nonzero(md.temperature > 0)[0]
    if len(random_rows):
        tokens[random_rows] = sample_random(logits, md, random_rows)
    return tokens
