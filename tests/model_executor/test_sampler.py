"""Sampler against exact expected distributions (numpy reference formulas), by chi-square tests.

Each setting draws thousands of independent samples from one fixed logit vector (one row per draw,
each with its own uniform number) and compares the counts with the distribution the filter rules
define: softmax(logits / T), min-p, top-k, then top-p on the renormalised remainder.
"""
import numpy as np
import paddle
import pytest
from scipy.stats import chisquare

from fastdeploy.model_executor.layers.sample.sampler import SamplingMetadata, sample

LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], dtype=np.float32)
DRAWS = 4000


def expected_distribution(temperature, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    x = LOGITS.astype(np.float64) / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    p = np.where(p >= min_p * p.max(), p, 0.0)
    order = np.argsort(-p, kind="stable")
    keep = np.zeros_like(p, dtype=bool)
    keep[order[: top_k or len(p)]] = True
    p = np.where(keep, p, 0.0) / p[keep].sum()
    sorted_p = p[order]
    before = np.cumsum(sorted_p) - sorted_p
    nucleus = order[before < top_p]
    q = np.zeros_like(p)
    q[nucleus] = p[nucleus]
    return q / q.sum()


def draw(temperature, top_k=0, top_p=1.0, min_p=0.0, seed=0, banned=()) -> np.ndarray:
    rows = DRAWS
    md = SamplingMetadata(
        temperature=np.full(rows, temperature), top_k=np.full(rows, top_k), top_p=np.full(rows, top_p),
        min_p=np.full(rows, min_p), uniforms=np.random.default_rng(seed).random(rows),
        banned=[(r, list(banned)) for r in range(rows)] if banned else [],
    )
    return sample(paddle.to_tensor(np.tile(LOGITS, (rows, 1))), md).token_ids


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=1.0),
        dict(temperature=0.5),
        dict(temperature=2.0),
        dict(temperature=1.0, top_k=3),
        dict(temperature=1.0, top_p=0.7),
        dict(temperature=1.0, min_p=0.2),
        dict(temperature=1.5, top_k=5, top_p=0.8, min_p=0.05),
    ],
)
def test_sampled_distribution_matches_reference(settings):
    tokens = draw(**settings)
    expected = expected_distribution(**settings)
    allowed = expected > 0
    assert not np.isin(tokens, np.nonzero(~allowed)[0]).any(), "a filtered-out token was sampled"
    counts = np.bincount(tokens, minlength=len(LOGITS))[allowed]
    f_exp = expected[allowed] / expected[allowed].sum() * counts.sum()
    assert chisquare(counts, f_exp).pvalue > 0.001


def test_greedy_is_the_argmax_and_ignores_uniforms():
    logits = np.random.default_rng(3).normal(size=(64, 1000)).astype(np.float32)
    md = SamplingMetadata(temperature=np.zeros(64), top_k=np.zeros(64, np.int64), top_p=np.ones(64),
                          min_p=np.zeros(64), uniforms=np.random.default_rng(4).random(64), banned=[])
    assert (sample(paddle.to_tensor(logits), md).token_ids == logits.argmax(axis=1)).all()


def test_top_k_one_equals_greedy_at_any_temperature():
    tokens = draw(temperature=3.0, top_k=1)
    assert (tokens == int(LOGITS.argmax())).all()


def test_banned_tokens_never_appear():
    tokens = draw(temperature=1.0, banned=(0, 1))
    assert not np.isin(tokens, [0, 1]).any()
    md = SamplingMetadata(temperature=np.zeros(1), top_k=np.zeros(1, np.int64), top_p=np.ones(1),
                          min_p=np.zeros(1), uniforms=np.zeros(1), banned=[(0, [0])])
    assert sample(paddle.to_tensor(LOGITS[None]), md).token_ids[0] == 1  # greedy falls to the runner-up


def test_same_uniforms_give_same_tokens():
    assert (draw(temperature=1.0, top_p=0.9, seed=7) == draw(temperature=1.0, top_p=0.9, seed=7)).all()
