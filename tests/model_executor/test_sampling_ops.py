"""The compiled sampling ops (custom_ops/cpu_ops/sampling.cc, penalties.cc) against their numpy
references (layers/sample/draw.py, penalties.py) and an exact float64 reference written here.

Draws: for each row, the float64 reference gives the kept tokens in draw order (token-id order
without top-k/top-p, else larger probability first, ties by lower id) and their CDF; the token drawn
with uniform u must be one whose CDF interval [C_before, C_after] holds u within TOL = 1e-5 (float32
weights: exp of logits whose float32 rounding alone moves a weight by ~1e-6 relative), or one whose
probability equals, within 1e-5 relative, that of the token holding u (such near-ties may sort either
way in float32). The compiled and the numpy tokens must both pass, and differ on at most a few rows. Filter parameters are nudged, by construction, away from thresholds that a token sits on
(within 1e-4 relative for min-p, 1e-5 of the mass for top-p, 1e-5 relative between the k-th and
k+1-th weights for top-k), so the kept set is the same for every implementation.
Logprobs: ids and ranks exactly (they compare logits only), logprobs within 1e-5 absolute (the op's exp).
Penalties: rtol 1e-6 (the op may multiply by 1 / repetition where numpy divides), atol 1e-6 (where
the subtraction of frequency and presence penalties cancels).
"""
import zlib

import fastdeploy  # noqa: F401  (before paddle)
import numpy as np
import paddle
import pytest
from scipy.stats import chisquare

from fastdeploy.model_executor.layers.sample.draw import sample_rows
from fastdeploy.model_executor.layers.sample.logprobs import compute_logprobs
from fastdeploy.model_executor.layers.sample.penalties import PenaltyInputs, apply_penalties
from fastdeploy.model_executor.layers.sample.sampler import SamplingMetadata, sample
from fastdeploy.model_executor.ops import compiled_op, fallbacks_forced
from fastdeploy.model_executor.ops.logprobs import token_logprobs
from fastdeploy.model_executor.ops.sampling import apply_penalties_, top_k_top_p_min_p_sampling
from fastdeploy.platforms.cpu import set_paddle_threads

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


# ---- penalties --------------------------------------------------------------------------------------
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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_penalties_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 5, (16, 49152)).astype(np.float32)
    logits[0, :10] = -np.inf  # banned earlier: stays -inf
    penalties = random_penalties(rng, 16, 49152)
    penalties.token_ids[:10][penalties.rows[:10] == 0] = np.arange(10)[penalties.rows[:10] == 0]
    expected = logits.copy()
    apply_penalties(expected, penalties)

    apply_penalties_(logits, penalties)

    np.testing.assert_allclose(logits, expected, rtol=1e-6, atol=1e-6)
    touched = np.zeros(logits.shape, bool)
    touched[penalties.rows, penalties.token_ids] = True
    assert (logits[~touched] == expected[~touched]).all()


def test_penalty_entries_outside_the_logits_raise():
    logits = np.zeros((2, 10), np.float32)
    bad = PenaltyInputs(np.array([1]), np.array([10]), np.ones(1, np.float32), np.ones(2, np.float32),
                        np.zeros(2, np.float32), np.ones(2, np.float32))
    with pytest.raises(Exception, match="outside logits"):
        apply_penalties_(logits, bad)


# ---- logprobs ---------------------------------------------------------------------------------------
def assert_logprobs_equal(got, want):
    np.testing.assert_array_equal(got.top_ids, want.top_ids)
    np.testing.assert_array_equal(got.top_ranks, want.top_ranks)
    np.testing.assert_array_equal(got.token_ranks, want.token_ranks)
    np.testing.assert_allclose(got.top_logprobs, want.top_logprobs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got.token_logprobs, want.token_logprobs, atol=1e-5, rtol=0)
    assert got.top_ids.dtype == np.int64 and got.top_logprobs.dtype == np.float32


@pytest.mark.parametrize("seed", range(3))
def test_compiled_logprobs_match_the_reference_with_ties_and_banned_tokens(seed):
    """Integer logits (many exact ties, some straddling the top-k cut), -inf entries, k from 0 to the
    vocabulary (beyond the finite entries too)."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        m, vocab = int(rng.integers(1, 5)), int(rng.integers(1, 80))
        logits = rng.integers(-4, 4, (m, vocab)).astype(np.float32)
        if rng.random() < 0.5:
            logits[rng.random((m, vocab)) < 0.4] = -np.inf
            logits[:, 0] = 2.0
        tokens = np.array([rng.choice(np.flatnonzero(np.isfinite(row))) for row in logits])
        k = int(rng.integers(0, vocab + 1))
        assert_logprobs_equal(token_logprobs(logits, tokens, k), compute_logprobs(logits, tokens, k))


@pytest.mark.parametrize("k", [0, 1, 5, 64, 100000])
def test_compiled_logprobs_match_the_reference_on_a_large_vocabulary(k):
    rng = np.random.default_rng(k)
    logits = make_logits("peaked", 6, 49152, rng)
    tokens = np.array([rng.choice(np.flatnonzero(np.isfinite(row))) for row in logits])
    got = token_logprobs(logits, tokens, k)
    assert got.top_ids.shape == (6, min(k, 49152))
    assert_logprobs_equal(got, compute_logprobs(logits, tokens, k))


def test_logprobs_fallback_runs_the_reference_row_by_row():
    logits = make_logits("flat", 3, 500, np.random.default_rng(1))
    tokens = np.array([7, 8, 9])
    with fallbacks_forced():
        got = token_logprobs(logits, tokens, 4)
    want = compute_logprobs(logits, tokens, 4)
    for name in ("top_ids", "top_logprobs", "top_ranks", "token_logprobs", "token_ranks"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))


# ---- the sampler end to end -------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_sample_with_compiled_ops_equals_sample_with_fallbacks(mode):
    """Penalties, bans, greedy and filtered rows, logprobs: the same tokens either way (but where u sits
    on a CDF boundary: then both tokens hold u), the same logprobs."""
    rng = np.random.default_rng(11)
    rows, vocab = 16, 49152
    logits = make_logits("peaked", rows, vocab, rng)
    filters = [FILTERS[r % len(FILTERS)] for r in range(rows)]
    temperature = np.array([0.0 if r % 5 == 0 else f[0] for r, f in enumerate(filters)])
    uniforms = rng.random(rows)
    penalties = random_penalties(rng, rows, vocab)
    banned = [(r, [int(t) for t in rng.choice(vocab, 3)]) for r in range(0, rows, 3)]
    processed = logits.copy()
    apply_penalties(processed, penalties)
    for r, ids in banned:
        processed[r, ids] = -np.inf
    top_k, top_p, min_p = np.zeros(rows), np.ones(rows), np.zeros(rows)
    references = {}
    for r in np.flatnonzero(temperature > 0):
        w = weights64(processed[r], temperature[r])
        top_k[r], top_p[r], min_p[r] = settled_filters(w, *filters[r][1:])
        references[r] = draw_order(w, int(top_k[r]), top_p[r], min_p[r])
    md = SamplingMetadata(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, uniforms=uniforms,
                          banned=banned, penalties=penalties, num_logprobs=np.array([(-1, 0, 3, 8)[r % 4] for r in range(rows)]),
                          logprobs_mode=mode)

    out = sample(paddle.to_tensor(logits), md)
    with fallbacks_forced():
        reference = sample(paddle.to_tensor(logits), md)

    greedy = temperature == 0
    np.testing.assert_array_equal(out.token_ids[greedy], processed[greedy].argmax(axis=1))
    np.testing.assert_array_equal(out.token_ids[greedy], reference.token_ids[greedy])
    for r, (ids, cdf) in references.items():
        assert holds(ids, cdf, int(out.token_ids[r]), uniforms[r]) and holds(ids, cdf, int(reference.token_ids[r]), uniforms[r])
    assert (out.token_ids != reference.token_ids).sum() <= 1
    for r, (got, want) in enumerate(zip(out.logprobs, reference.logprobs)):
        assert (got is None) == (want is None)
        if got is not None:
            assert got.top_ids.shape == want.top_ids.shape == (1, md.num_logprobs[r])
            np.testing.assert_array_equal(got.top_ids, want.top_ids)
            np.testing.assert_allclose(got.top_logprobs, want.top_logprobs, rtol=0, atol=1e-5)
            if out.token_ids[r] == reference.token_ids[r]:
                np.testing.assert_allclose(got.token_logprobs, want.token_logprobs, rtol=0, atol=1e-5)
                np.testing.assert_array_equal(got.token_ranks, want.token_ranks)
