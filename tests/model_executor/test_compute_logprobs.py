"""compute_logprobs (layers/sample/logprobs.py) against a dense numpy reference: top-k ids (ties:
lower id first), logprobs and ranks (ties share a rank, as in vLLM), banned tokens, k clamped to the
vocabulary.
"""
import fastdeploy  # noqa: F401  (before paddle)
import numpy as np
import pytest

from fastdeploy.model_executor.layers.sample import logprobs

from penalty_batches import log_softmax


def reference_logprobs(logits: np.ndarray, token_ids: np.ndarray, k: int):
    lp = log_softmax(logits)
    vocab = logits.shape[1]
    top_ids = np.stack([np.lexsort((np.arange(vocab), -row))[:k] for row in logits])  # ties: lower id first
    ranks = lambda row, v: 1 + int((row > v).sum())  # noqa: E731
    top_ranks = np.array([[ranks(row, row[t]) for t in ids] for row, ids in zip(logits, top_ids)], np.int64)
    token_ranks = np.array([ranks(row, row[t]) for row, t in zip(logits, token_ids)], np.int64)
    chosen = lp[np.arange(len(logits)), token_ids]
    return top_ids.reshape(len(logits), k), np.take_along_axis(lp, top_ids.reshape(len(logits), k), 1), top_ranks.reshape(len(logits), k), chosen, token_ranks


@pytest.mark.parametrize("k", [0, 1, 5, 64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compute_logprobs_matches_reference(seed, k):
    rng = np.random.default_rng(seed)
    m, vocab = 6, 64
    logits = rng.normal(0, 4, size=(m, vocab)).astype(np.float32)
    token_ids = rng.integers(0, vocab, size=m)
    got = logprobs.compute_logprobs(logits, token_ids, k)
    top_ids, top_lp, top_ranks, chosen, token_ranks = reference_logprobs(logits, token_ids, k)
    assert got.top_ids.shape == (m, k) and got.top_ids.dtype == np.int64
    np.testing.assert_array_equal(got.top_ids, top_ids)
    np.testing.assert_allclose(got.top_logprobs, top_lp, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got.top_ranks, top_ranks)
    np.testing.assert_allclose(got.token_logprobs, chosen, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got.token_ranks, token_ranks)


@pytest.mark.parametrize("k", [1, 5, 20, 39])
def test_compute_logprobs_with_banned_tokens_and_widely_spread_logits(k):
    """-inf entries (banned tokens in processed mode) tie among themselves; k may exceed the finite
    tokens. Logits spread over thousands of units are handled like any others."""
    rng = np.random.default_rng(k)
    logits = np.stack([rng.normal(0, 1000, 40), rng.normal(0, 0.01, 40), rng.normal(0, 3, 40)]).astype(np.float32)
    logits[2, rng.choice(40, 30, replace=False)] = -np.inf
    logits[0, 7] = logits[0, 3]  # an exact tie
    token_ids = np.array([3, 0, int(np.flatnonzero(np.isfinite(logits[2]))[0])])
    got = logprobs.compute_logprobs(logits, token_ids, k)
    top_ids, top_lp, top_ranks, chosen, token_ranks = reference_logprobs(logits, token_ids, k)
    np.testing.assert_array_equal(got.top_ids, top_ids)
    np.testing.assert_allclose(got.top_logprobs, top_lp, atol=1e-5, rtol=1e-6)  # float32 outputs near -1000
    np.testing.assert_array_equal(got.top_ranks, top_ranks)
    np.testing.assert_allclose(got.token_logprobs, chosen, atol=1e-5, rtol=1e-6)  # float32 outputs near -1000
    np.testing.assert_array_equal(got.token_ranks, token_ranks)


def test_compute_logprobs_with_a_large_k_is_clamped_to_the_vocabulary():
    logits = np.random.default_rng(5).normal(size=(3, 10)).astype(np.float32)
    got = logprobs.compute_logprobs(logits, np.array([0, 1, 2]), 1000)
    np.testing.assert_array_equal(got.top_ids, np.argsort(-logits, axis=1))
    np.testing.assert_allclose(np.exp(got.top_logprobs.astype(np.float64)).sum(axis=1), 1.0, rtol=1e-5)


def test_compute_logprobs_ties_share_a_rank_and_list_the_lower_id_first():
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 2.0, 0.0]], np.float32)
    for k, ids, ranks in [(6, [1, 2, 4, 0, 3, 5], [1, 1, 3, 4, 5, 5]), (3, [1, 2, 4], [1, 1, 3])]:
        got = logprobs.compute_logprobs(logits, np.array([2]), k)
        assert got.top_ids[0].tolist() == ids and got.top_ranks[0].tolist() == ranks
        assert got.token_ranks[0] == 1  # token 2 ties with token 1: nothing strictly larger
    got = logprobs.compute_logprobs(logits, np.array([5]), 0)
    assert got.token_ranks[0] == 5  # four tokens strictly above 0.0; its tie (token 3) does not count


def test_compute_logprobs_ties_cut_by_k_keep_the_lower_id():
    """A tie straddling the top-k cut: the documented order (ties: lower id first) keeps the lower id."""
    got = logprobs.compute_logprobs(np.array([[0.0, 3.0, 2.0, 3.0, 1.0, 3.0, 3.0]], np.float32), np.array([0]), 3)
    assert got.top_ids[0].tolist() == [1, 3, 5] and got.top_ranks[0].tolist() == [1, 1, 1]
    rng = np.random.default_rng(0)
    for _ in range(300):
        vocab = int(rng.integers(3, 40))
        logits = rng.integers(0, 5, size=(1, vocab)).astype(np.float32)
        k = int(rng.integers(1, vocab))
        got = logprobs.compute_logprobs(logits, np.array([0]), k)
        expected = np.lexsort((np.arange(vocab), -logits[0]))[:k]
        assert got.top_ids[0].tolist() == expected.tolist(), (logits[0].tolist(), k)
