"""-inf logits (banned tokens, masks) through the compiled sampling and logprobs ops
(custom_ops/cpu_ops/sampling.cc, logprobs.cc) against numpy formulas written here in float64.

The ops are built without -ffast-math (custom_ops/setup_ops.py): under its -ffinite-math-only the
compiler may assume no operand is infinite, and these are the inputs that hold them. Draws use a
uniform in the middle of each kept token's CDF interval, so float32 rounding cannot move the token;
logprobs are compared within 1e-5 absolute (the op's exp), ids and ranks exactly.
"""
import fastdeploy  # noqa: F401  (before paddle)
import numpy as np
import pytest

from fastdeploy.model_executor.ops import compiled_op, fallbacks_forced
from fastdeploy.model_executor.ops.logprobs import token_logprobs
from fastdeploy.model_executor.ops.sampling import top_k_top_p_min_p_sampling


@pytest.fixture(autouse=True)
def compiled():
    with fallbacks_forced(False):
        assert compiled_op("fd_top_k_top_p_min_p_sampling") is not None, "the compiled sampling op is not built"
        assert compiled_op("fd_token_logprobs") is not None, "the compiled logprobs op is not built"
        yield


def kept_tokens(row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float):
    """(kept ids in draw order, their normalised CDF): w = exp(l / T - max / T), 0 for -inf and below
    min_p; token-id order without top-k/top-p, else larger w first (ties by lower id), the first top_k,
    then those whose mass before them is below top_p of the total."""
    scaled = row.astype(np.float64) / temperature
    w = np.exp(scaled - scaled.max())
    w[w < min_p] = 0.0
    if top_k <= 0 and top_p >= 1:
        ids = np.flatnonzero(w > 0)
    else:
        ids = np.lexsort((np.arange(len(w)), -w))[: int((w > 0).sum())]
        ids = ids[:top_k] if top_k > 0 else ids
        before = np.cumsum(w[ids]) - w[ids]
        ids = ids[before < top_p * w[ids].sum()]
    cdf = np.cumsum(w[ids])
    return ids, cdf / cdf[-1]


def draw(logits, temperature, top_k, top_p, min_p, u):
    """The op on every row with the same filters. Temperature 0 is given to every other row only (the
    shim answers an all-greedy batch with numpy's argmax, not the op)."""
    rows = len(logits)
    temperatures = np.where(np.arange(rows) % 2, 1.0, 0.0) if temperature == 0 else np.full(rows, temperature)
    return top_k_top_p_min_p_sampling(logits, temperatures, np.full(rows, float(top_k)),
                                      np.full(rows, top_p), np.full(rows, min_p), np.asarray(u, np.float64))


FILTERS = [(1.0, 0, 1.0, 0.0), (0.7, 0, 0.8, 0.0), (1.0, 2, 1.0, 0.0), (1.3, 0, 1.0, 0.2), (1.0, 3, 0.9, 0.1)]


@pytest.mark.parametrize("vocab", [7, 1000, 49152])
@pytest.mark.parametrize("filters", FILTERS + [(0.0, 0, 1.0, 0.0)], ids=lambda f: "T{}-k{}-p{}-minp{}".format(*f))
def test_a_row_with_one_finite_logit_always_draws_it(vocab, filters):
    """Every logit -inf but one, at the ends, at block (1024) and chunk (64) edges and inside them."""
    places = sorted({p for p in (0, 1, 63, 64, 1023, 1024, 4000, vocab // 2, vocab - 1) if p < vocab})
    logits = np.full((len(places) * 3, vocab), -np.inf, np.float32)
    where = np.repeat(places, 3)
    logits[np.arange(len(logits)), where] = np.tile([3.5, -80.0, 0.0], len(places))  # the exp(-80) scale too
    uniforms = np.tile([0.0, 0.5, float(np.nextafter(1.0, 0.0))], len(places))

    np.testing.assert_array_equal(draw(logits, *filters, uniforms), where)


@pytest.mark.parametrize("vocab", [16, 1000, 49152])
@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: "T{}-k{}-p{}-minp{}".format(*f))
def test_draws_among_a_few_finite_logits_follow_the_reference(vocab, filters):
    """Five finite logits among -inf: for u in the middle of each kept token's CDF interval, that token."""
    rng = np.random.default_rng(vocab)
    row = np.full(vocab, -np.inf, np.float32)
    finite = rng.choice(vocab, 5, replace=False)
    row[finite] = [1.0, 0.2, -0.5, 0.9, -1.7]
    ids, cdf = kept_tokens(row, *filters)
    assert 1 <= len(ids) <= 5 and set(ids.tolist()) <= set(finite.tolist())
    uniforms = (cdf - np.diff(cdf, prepend=0.0) / 2)  # the middle of each interval
    np.testing.assert_array_equal(draw(np.tile(row, (len(ids), 1)), *filters, uniforms), ids)


def logprobs_reference(logits: np.ndarray, tokens: np.ndarray, k: int):
    """(top ids, top logprobs, top ranks, token logprobs, token ranks) in float64: logprob = l -
    logsumexp over the finite logits; rank = 1 + entries strictly larger; top-k larger first, ties
    (the -inf ones too) by lower id."""
    out = [[], [], [], [], []]
    for row, token in zip(logits.astype(np.float64), tokens):
        top = row.max()
        lse = top + np.log(np.exp(row - top).sum())
        order = np.lexsort((np.arange(len(row)), -row))[:k]
        out[0].append(order)
        out[1].append(row[order] - lse)
        out[2].append([1 + int((row > row[i]).sum()) for i in order])
        out[3].append(row[token] - lse)
        out[4].append(1 + int((row > row[token]).sum()))
    return [np.array(o) for o in out]


@pytest.mark.parametrize("vocab", [5, 300, 49152])
def test_logprobs_of_rows_with_minus_inf_follow_the_reference(vocab):
    """Rows with 0%, 50%, 99% and all-but-one -inf logits; k beyond the finite entries, so the top-k
    holds -inf entries (logprob -inf, ranked after every finite one)."""
    rng = np.random.default_rng(vocab + 1)
    logits = rng.normal(0, 3, (4, vocab)).astype(np.float32)
    for r, share in enumerate([0.0, 0.5, 0.99]):
        logits[r, rng.random(vocab) < share] = -np.inf
    logits[3] = -np.inf
    logits[:, vocab // 3] = 2.5  # one finite entry per row at least
    tokens = np.array([rng.choice(np.flatnonzero(np.isfinite(row))) for row in logits])
    k = min(vocab, 8)
    if vocab > 300:
        k = int(np.isfinite(logits[2]).sum()) + 3
    got = token_logprobs(logits, tokens, k)
    top_ids, top_lp, top_ranks, token_lp, token_ranks = logprobs_reference(logits, tokens, k)

    np.testing.assert_array_equal(got.top_ids, top_ids)
    np.testing.assert_array_equal(got.top_ranks, top_ranks)
    np.testing.assert_array_equal(got.token_ranks, token_ranks)
    np.testing.assert_allclose(got.top_logprobs, top_lp, rtol=0, atol=1e-5)  # equal infinities pass
    np.testing.assert_allclose(got.token_logprobs, token_lp, rtol=0, atol=1e-5)
    assert np.isneginf(got.top_logprobs).any() == np.isneginf(top_lp).any()
    assert got.token_logprobs[3] == 0.0  # the only finite logit holds all the mass: log 1
