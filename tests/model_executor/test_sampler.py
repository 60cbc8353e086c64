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


# ---- larger vocabularies: the candidate search of top-k/top-p and the blocked full draw -------------
def reference_distribution(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, banned=()) -> np.ndarray:
    """softmax(logits / T) with bans, then min-p, top-k, top-p on the renormalised rest (float64)."""
    x = logits.astype(np.float64) / temperature
    x[list(banned)] = -np.inf
    p = np.exp(x - x.max())
    p /= p.sum()
    if min_p > 0:
        ratio = p / p.max()
        assert np.abs(ratio - min_p).min() > 1e-5 * min_p, "a token sits on the min-p threshold"
        p = np.where(ratio >= min_p, p, 0.0)
    order = np.argsort(-p, kind="stable")  # ties: lower id first
    if top_k > 0:
        p[order[top_k:]] = 0.0
    p /= p.sum()
    sorted_p = p[order]
    before = np.cumsum(sorted_p) - sorted_p
    if top_p < 1:
        live = sorted_p > 0
        assert np.abs(before[live] - top_p).min() > 1e-6, "a token sits on the top-p boundary"
    q = np.zeros_like(p)
    nucleus = order[(before < top_p) & (sorted_p > 0)]
    q[nucleus] = p[nucleus]
    return q / q.sum()


def draw_rows(logits, rows, seed, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, banned=()) -> np.ndarray:
    md = SamplingMetadata(
        temperature=np.full(rows, temperature), top_k=np.full(rows, top_k), top_p=np.full(rows, top_p),
        min_p=np.full(rows, min_p), uniforms=np.random.default_rng(seed).random(rows),
        banned=[(r, list(banned)) for r in range(rows)] if banned else [],
    )
    return sample(paddle.to_tensor(np.tile(logits, (rows, 1))), md).token_ids


def binned_chisquare_pvalue(tokens, q, min_expected=40.0) -> float:
    """Chi-square of token counts against q; consecutive token ids are merged into bins until each
    bin expects >= min_expected draws (a dominant token is a bin of its own)."""
    n = len(tokens)
    counts = np.bincount(tokens, minlength=len(q))
    observed, expected = [], []
    c = e = 0.0
    for t in np.flatnonzero(q > 0):
        c, e = c + counts[t], e + q[t] * n
        if e >= min_expected:
            observed.append(c)
            expected.append(e)
            c = e = 0.0
    if e > 0:
        observed[-1] += c
        expected[-1] += e
    assert len(observed) >= 10
    return chisquare(observed, expected).pvalue


def dominant_and_tail(vocab=3000, seed=0) -> np.ndarray:
    """Three dominant tokens (~75% of the mass) and a long flat-ish random tail (each token ~1e-4 of
    the mass, below the first candidate cut of 1e-3 x p_max)."""
    logits = np.random.default_rng(seed).uniform(-1, 0, vocab).astype(np.float32)
    logits[[17, 1500, vocab - 1]] = [8.0, 7.5, 7.0]
    return logits


def check_draws(tokens, q):
    assert not np.isin(tokens, np.flatnonzero(q == 0)).any(), "a filtered-out token was sampled"
    assert binned_chisquare_pvalue(tokens, q) > 0.001


def test_top_p_nucleus_reaching_into_a_long_tail():
    logits = dominant_and_tail()
    q = reference_distribution(logits, top_p=0.95)
    tail = np.ones(len(q), bool)
    tail[[17, 1500, len(q) - 1]] = False
    assert 500 < (q[tail] > 0).sum() < tail.sum()  # the nucleus takes part of the tail only
    tokens = draw_rows(logits, 6000, seed=11, top_p=0.95)
    check_draws(tokens, q)
    assert np.isin(tokens, np.flatnonzero(tail)).sum() > 600


def test_top_p_renormalises_over_the_mass_below_the_candidate_cut():
    """top_p 0.5 over weights 1 and 0.6 and a tail of 1000 x 5e-4 (each below the first candidate cut,
    1e-3 x p_max): the tail holds 0.5 of the total 2.1, so the second token (mass before it 1 < 0.5 x
    2.1) is in the nucleus; measured against the candidates' mass alone (1.6) it would not be."""
    logits = np.full(1002, np.log(5e-4), np.float32)
    logits[[0, 1]] = [0.0, np.log(0.6)]
    tokens = draw_rows(logits, 4000, seed=14, top_p=0.5)
    assert set(np.unique(tokens).tolist()) == {0, 1}
    assert abs((tokens == 1).mean() - 0.6 / 1.6) < 0.05


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=1.3, top_k=1000, top_p=0.9, min_p=1.4e-3),
        dict(temperature=1.3, top_k=1000, min_p=1.4e-3),
        dict(temperature=1.0, top_k=800),  # candidates lowered below the first cut to hold k
        dict(temperature=0.9, top_k=2000, top_p=0.97, banned=(17, 5, 2998)),
    ],
)
def test_top_k_top_p_min_p_on_a_large_vocabulary(settings):
    logits = dominant_and_tail()
    q = reference_distribution(logits, **settings)
    unfiltered = reference_distribution(logits, settings["temperature"], banned=settings.get("banned", ()))
    assert 3 < (q > 0).sum() < (unfiltered > 0).sum()
    if settings.get("top_p", 1) < 1:  # top-p binds after top-k and min-p
        no_top_p = {**settings, "top_p": 1.0}
        assert (q > 0).sum() < (reference_distribution(logits, **no_top_p) > 0).sum()
    check_draws(draw_rows(logits, 5000, seed=12, **settings), q)


def blocked_logits(vocab=2500, seed=1, tail_shift=4.0) -> np.ndarray:
    """Not a multiple of the 1024-token block: two full blocks and a tail block (ids 2048..2499)
    holding lower logits (by tail_shift), plus two dominant tokens."""
    logits = np.random.default_rng(seed).uniform(-2, 0, vocab).astype(np.float32)
    logits[2048:] -= tail_shift
    logits[[3, 1100]] = [3.0, 2.0]
    return logits


@pytest.mark.parametrize(
    "settings, layout",
    [
        (dict(temperature=1.0, banned=(0, 5, 1023, 1024, 2047, 2048, 2300, 2499)), "bans in every block"),
        (dict(temperature=1.2, banned=(1, 1024, 2048, 2498, 2499)), "a heavy tail block"),
        (dict(temperature=0.8, banned=(3,)), "the top token banned"),
        (dict(temperature=1.0, min_p=0.01, banned=(0, 3, 1023)), "min-p empties the tail block"),
        (dict(temperature=1.5, min_p=0.05, banned=(1100, 2499)), "min-p keeps one token in the tail block"),
    ],
)
def test_full_draw_over_blocks_with_bans_and_min_p(settings, layout):
    logits = blocked_logits(tail_shift=0.0 if layout == "a heavy tail block" else 4.0)
    if layout.startswith("min-p keeps"):
        logits[2400] = 2.5
    q = reference_distribution(logits, **settings)
    if layout == "a heavy tail block":
        assert q[2048:].sum() > 0.1
    if layout == "min-p empties the tail block":
        assert q[2048:].sum() == 0 and (q[:2048] > 0).sum() > 1000
    if layout.startswith("min-p keeps"):
        assert np.flatnonzero(q[2048:]).tolist() == [2400 - 2048]
    check_draws(draw_rows(logits, 6000, seed=13, **settings), q)


@pytest.mark.parametrize("u", [0.0, 1e-12, 0.5, 1 - 1e-12, float(np.nextafter(1.0, 0.0))])
@pytest.mark.parametrize(
    "settings",
    [
        dict(banned=(0, 1, 2, 2497, 2498, 2499)),
        dict(min_p=0.01, banned=(0, 3, 1023)),
        dict(top_p=0.9, banned=(3,)),
        dict(top_k=50, min_p=0.01),
    ],
)
def test_extreme_uniforms_never_draw_a_zero_probability_token(settings, u):
    logits = blocked_logits()
    q = reference_distribution(logits, **settings)
    md = SamplingMetadata(
        temperature=np.ones(1), top_k=np.full(1, settings.get("top_k", 0)), top_p=np.full(1, settings.get("top_p", 1.0)),
        min_p=np.full(1, settings.get("min_p", 0.0)), uniforms=np.array([u]),
        banned=[(0, list(settings["banned"]))] if "banned" in settings else [],
    )
    token = int(sample(paddle.to_tensor(logits[None].copy()), md).token_ids[0])
    assert q[token] > 0, f"token {token} has probability 0"
