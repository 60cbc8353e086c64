"""The compiled sampling op (custom_ops/cpu_ops/sampling.cc) against its numpy reference
(layers/sample/draw.py) and an exact float64 reference (sampling_reference.py).

Draws: for each row, the float64 reference gives the kept tokens in draw order (token-id order
without top-k/top-p, else larger probability first, ties by lower id) and their CDF; the token drawn
with uniform u must be one whose CDF interval [C_before, C_after] holds u within TOL = 1e-5 (float32
weights: exp of logits whose float32 rounding alone moves a weight by ~1e-6 relative), or one whose
probability equals, within 1e-5 relative, that of the token holding u (such near-ties may sort either
way in float32). The compiled and the numpy tokens must both pass, and differ on at most a few rows. Filter parameters are nudged, by construction, away from thresholds that a token sits on
(within 1e-4 relative for min-p, 1e-5 of the mass for top-p, 1e-5 relative between the k-th and
k+1-th weights for top-k), so the kept set is the same for every implementation.
Logprobs, penalties and the whole sampler: test_sampling_ops_logprobs.py, _penalties.py, _sampler.py.
"""
import zlib

import fastdeploy  # noqa: F401  (before paddle)
import numpy as np
import pytest
from scipy.stats import chisquare

from fastdeploy.model_executor.layers.sample.draw import sample_rows
from fastdeploy.model_executor.ops.sampling import top_k_top_p_min_p_sampling
from fastdeploy.platforms.cpu import set_paddle_threads

from sampling_reference import compiled  # noqa: F401  (autouse fixture: every test here runs the compiled ops)
from sampling_reference import FILTERS, draw_order, holds, make_logits, settled_filters, weights64


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: "T{}-k{}-p{}-minp{}".format(*f))
@pytest.mark.parametrize("kind", ["flat", "peaked"])
@pytest.mark.parametrize("vocab", [49152, 1000, 7])
def test_compiled_draw_matches_the_reference(vocab, kind, filters):
    rng = np.random.default_rng(zlib.crc32(repr((vocab, kind, filters)).encode()))
    rows = 12 if vocab == 49152 else 64
    logits = make_logits(kind, rows, vocab, rng)
    temperature, top_k, top_p, min_p = (np.empty(rows) for _ in range(4))
    uniforms = rng.random(rows)
    references = []
    for r in range(rows):
        w = weights64(logits[r], filters[0])
        k, p, m = settled_filters(w, filters[1], filters[2], filters[3])
        temperature[r], top_k[r], top_p[r], min_p[r] = filters[0], k, p, m
        references.append(draw_order(w, k, p, m))
    before = logits.copy()

    got = top_k_top_p_min_p_sampling(logits, temperature, top_k, top_p, min_p, uniforms)
    expected = sample_rows(logits, temperature, top_k, top_p, min_p, uniforms)

    assert got.dtype == np.int64 and got.shape == (rows,)
    np.testing.assert_array_equal(logits, before)  # the op reads the logits only
    for r, (ids, cdf) in enumerate(references):
        assert holds(ids, cdf, int(got[r]), uniforms[r]), f"row {r}: compiled token {got[r]} not at u={uniforms[r]}"
        assert holds(ids, cdf, int(expected[r]), uniforms[r]), f"row {r}: numpy token {expected[r]}"
    assert (got != expected).sum() <= max(1, rows // 20)


@pytest.mark.parametrize("vocab", [49152, 1000, 1])
def test_greedy_rows_are_the_first_argmax(vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.integers(-3, 3, (40, vocab)).astype(np.float32)  # many exact ties
    logits[5] = -np.inf  # every token banned: any index in range
    rows = len(logits)
    temperature = np.where(np.arange(rows) % 2, 0.0, 1.0)  # greedy rows among sampled ones
    got = top_k_top_p_min_p_sampling(logits, temperature, np.zeros(rows), np.ones(rows), np.zeros(rows),
                                     rng.random(rows))
    greedy = np.flatnonzero(temperature == 0)
    np.testing.assert_array_equal(got[greedy], logits[greedy].argmax(axis=1))
    assert ((got >= 0) & (got < vocab)).all()


def test_a_batch_run_by_threads_draws_what_each_row_draws_alone():
    """128 x 131072 logits (the op's threshold for OpenMP threads, 2^24) run over threads; a row alone
    runs on one."""
    set_paddle_threads()  # one OpenMP thread per usable core, as an engine sets them
    rng = np.random.default_rng(5)
    rows, vocab = 128, 131072
    logits = rng.normal(0, 2, (rows, vocab)).astype(np.float32)
    logits[np.arange(rows), rng.integers(0, vocab, rows)] += 12.0
    t, k, p, m = (np.array([FILTERS[r % len(FILTERS)][i] for r in range(rows)], np.float64) for i in range(4))
    u = rng.random(rows)
    batch = top_k_top_p_min_p_sampling(logits, t, k, p, m, u)
    alone = [top_k_top_p_min_p_sampling(logits[r : r + 1], t[r : r + 1], k[r : r + 1], p[r : r + 1], m[r : r + 1],
                                        u[r : r + 1])[0] for r in range(rows)]
    np.testing.assert_array_equal(batch, alone)


@pytest.mark.parametrize("u", [0.0, 1e-12, 0.5, float(np.nextafter(1.0, 0.0))])
@pytest.mark.parametrize("filters", [(1.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.3), (1.0, 0, 0.5, 0.0), (1.0, 3, 1.0, 0.0),
                                     (1.0, 10**9, 1.0, 0.0)])
def test_extreme_uniforms_never_draw_a_filtered_token(filters, u):
    """Bans at both ends and in every 1024-token block; top_k beyond the vocabulary is no filter."""
    logits = np.random.default_rng(3).uniform(-2, 0, (1, 2500)).astype(np.float32)
    banned = [0, 1, 1023, 1024, 2047, 2048, 2498, 2499]
    logits[0, banned] = -np.inf
    temperature, top_k, top_p, min_p = (np.array([f], np.float64) for f in filters)
    token = int(top_k_top_p_min_p_sampling(logits, temperature, top_k, top_p, min_p, np.array([u]))[0])
    ids, _ = draw_order(weights64(logits[0], 1.0), min(filters[1], 2500), filters[2], filters[3])
    assert token in set(ids.tolist()) and token not in banned


# ---- distribution -----------------------------------------------------------------------------------
def binned_chisquare_pvalue(tokens: np.ndarray, q: np.ndarray, min_expected: float = 40.0) -> float:
    """Chi-square of token counts against q, consecutive ids merged until each bin expects min_expected."""
    counts = np.bincount(tokens, minlength=len(q))
    observed, expected, c, e = [], [], 0.0, 0.0
    for t in np.flatnonzero(q > 0):
        c, e = c + counts[t], e + q[t] * len(tokens)
        if e >= min_expected:
            observed.append(c)
            expected.append(e)
            c = e = 0.0
    observed[-1] += c
    expected[-1] += e
    assert len(observed) >= 5
    return chisquare(observed, expected).pvalue


@pytest.mark.parametrize("filters", [(1.0, 0, 1.0, 0.0), (0.8, 0, 0.9, 0.0), (1.2, 300, 1.0, 0.0),
                                     (1.0, 300, 0.8, 0.002), (1.5, 0, 1.0, 0.01)])
def test_compiled_draws_follow_the_processed_distribution(filters):
    """8000 draws from one row (vocab 4096, a dominant head and a long tail) against the exact
    processed probabilities (float64); no token outside them is ever drawn."""
    rng = np.random.default_rng(9)
    row = rng.uniform(-3, 0, 4096).astype(np.float32)
    row[rng.choice(4096, 4, replace=False)] = [4.0, 3.5, 3.0, 2.0]
    w = weights64(row, filters[0])
    top_k, top_p, min_p = settled_filters(w, *filters[1:])
    ids, cdf = draw_order(w, top_k, top_p, min_p)
    q = np.zeros(len(row))
    q[ids] = np.diff(cdf, prepend=0.0)
    logits = np.tile(row, (1000, 1))
    tokens = np.concatenate([
        top_k_top_p_min_p_sampling(logits, np.full(1000, filters[0]), np.full(1000, top_k), np.full(1000, top_p),
                                   np.full(1000, min_p), rng.random(1000))
        for _ in range(8)
    ])
    assert q[tokens].min() > 0, "a filtered-out token was drawn"
    assert binned_chisquare_pvalue(tokens, q) > 1e-3

