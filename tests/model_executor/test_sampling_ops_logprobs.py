"""The compiled logprobs op (custom_ops/cpu_ops/logprobs.cc) against its numpy reference
(layers/sample/logprobs.py).

Logprobs: ids and ranks exactly (they compare logits only), logprobs within 1e-5 absolute (the op's exp).
"""
import fastdeploy  # noqa: F401  (before paddle)
import numpy as np
import pytest

from fastdeploy.model_executor.layers.sample.logprobs import compute_logprobs
from fastdeploy.model_executor.ops import fallbacks_forced
from fastdeploy.model_executor.ops.logprobs import token_logprobs

from sampling_reference import compiled  # noqa: F401  (autouse fixture: every test here runs the compiled ops)
from sampling_reference import make_logits


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

