"""Shared by the compiled sampling-op tests (test_sampling_ops*.py): the fixture that makes every test
run the compiled ops, an exact float64 reference of the sampler's draw (filters settled off their
thresholds, draw order, CDF, the TOL within which a drawn token's interval must hold u), test logits,
filter settings and random penalty inputs. The tolerances are explained in test_sampling_ops.py.
"""
import fastdeploy  # noqa: F401  (before paddle)
import numpy as np
import pytest

from fastdeploy.model_executor.layers.sample.penalties import PenaltyInputs
from fastdeploy.model_executor.ops import compiled_op, fallbacks_forced

TOL = 1e-5


@pytest.fixture(autouse=True)
def compiled():
    """Every test here runs the compiled ops (and fails when they were not built)."""
    with fallbacks_forced(False):
        assert compiled_op("fd_top_k_top_p_min_p_sampling") is not None, "the compiled sampling op is not built"
        assert compiled_op("fd_apply_penalties_") is not None, "the compiled penalties op is not built"
        assert compiled_op("fd_token_logprobs") is not None, "the compiled logprobs op is not built"
        yield


# ---- float64 reference -----------------------------------------------------------------------------
def weights64(row: np.ndarray, temperature: float) -> np.ndarray:
    """p / p_max in float64 from the float32 logits divided by temperature in float32 (as the sampler)."""
    scaled = (row / np.float32(temperature)).astype(np.float64)
    return np.exp(scaled - scaled.max())


def settled_filters(w: np.ndarray, top_k: int, top_p: float, min_p: float) -> tuple[int, float, float]:
    """The filters, moved off any threshold a token sits on (see the module docstring)."""
    while min_p > 0 and np.abs(w / min_p - 1).min() < 1e-4:
        min_p *= 1.003
    w = np.where(w >= min_p, w, 0.0)
    order = np.lexsort((np.arange(len(w)), -w))
    positive = int((w > 0).sum())
    while 0 < top_k < positive and w[order[top_k - 1]] - w[order[top_k]] < 1e-5 * w[order[top_k - 1]]:
        top_k += 1
    kept = w[order[: top_k if 0 < top_k < positive else positive]]
    before = (np.cumsum(kept) - kept) / kept.sum()
    while top_p < 1 and np.abs(before - top_p).min() < 1e-5:
        top_p = min(1.0, top_p + 1e-3) if top_p < 0.999 else 1.0
    return top_k, top_p, min_p


def draw_order(w: np.ndarray, top_k: int, top_p: float, min_p: float) -> tuple[np.ndarray, np.ndarray]:
    """(kept token ids in draw order, their normalised CDF) of the sampler's rules, in float64."""
    w = np.where(w >= min_p, w, 0.0) if min_p > 0 else w
    if top_k <= 0 and top_p >= 1:
        ids = np.flatnonzero(w > 0)
    else:
        ids = np.lexsort((np.arange(len(w)), -w))[: int((w > 0).sum())]
        ids = ids[:top_k] if top_k > 0 else ids
        values = w[ids]
        before = np.cumsum(values) - values
        ids = ids[before < top_p * values.sum()]
    cdf = np.cumsum(w[ids])
    return ids, cdf / cdf[-1]


def holds(ids: np.ndarray, cdf: np.ndarray, token: int, u: float) -> bool:
    """Whether token's CDF interval holds u within TOL, or the token whose interval holds u has, within
    1e-5 relative, the same probability (near-ties may be sorted either way in float32)."""
    where = np.flatnonzero(ids == token)
    if not len(where):
        return False
    j, drawn = int(where[0]), min(int(np.searchsorted(cdf, u, side="right")), len(ids) - 1)
    q = np.diff(cdf, prepend=0.0)
    return (cdf[j - 1] if j else 0.0) - TOL <= u <= cdf[j] + TOL or abs(q[j] - q[drawn]) <= 1e-5 * q[drawn]


# ---- logits -----------------------------------------------------------------------------------------
def make_logits(kind: str, rows: int, vocab: int, rng) -> np.ndarray:
    """flat: uniform in [-1, 0] (the nucleus holds most of the vocabulary); peaked: a language model's
    shape, a few tokens far above a normal bulk; both with some -inf (banned) entries."""
    if kind == "flat":
        x = rng.uniform(-1, 0, (rows, vocab))
    else:
        x = rng.normal(0, 2, (rows, vocab))
        for r in range(rows):
            x[r, rng.choice(vocab, min(5, vocab), replace=False)] += rng.uniform(8, 14, min(5, vocab))
    x = x.astype(np.float32)
    if vocab > 4:
        x[rng.random((rows, vocab)) < 0.01] = -np.inf
        x[np.arange(rows), rng.integers(0, vocab, rows)] = 1.0  # at least one finite entry per row
    return x


FILTERS = [  # (temperature, top_k, top_p, min_p)
    (1.0, 0, 1.0, 0.0),
    (0.7, 0, 0.9, 0.0),
    (1.0, 0, 0.1, 0.0),
    (1.0, 1, 1.0, 0.0),
    (0.7, 50, 1.0, 0.0),
    (0.7, 50, 0.9, 0.05),
    (1.3, 0, 1.0, 0.05),
    (1.0, 50, 0.1, 0.05),
]



def random_penalties(rng, rows: int, vocab: int) -> PenaltyInputs:
    per_row = [rng.choice(vocab, int(rng.integers(0, 300)), replace=False) for _ in range(rows)]
    return PenaltyInputs(
        rows=np.concatenate([np.full(len(ids), r, np.int64) for r, ids in enumerate(per_row)]),
        token_ids=np.concatenate(per_row).astype(np.int64),
        output_counts=rng.integers(0, 4, sum(len(ids) for ids in per_row)).astype(np.float32),
        repetition=rng.choice([1.0, 1.1, 1.5, 0.8], rows).astype(np.float32),
        frequency=rng.choice([0.0, 0.5, -0.3], rows).astype(np.float32),
        presence=rng.choice([0.0, 0.5, 1.2], rows).astype(np.float32),
    )

