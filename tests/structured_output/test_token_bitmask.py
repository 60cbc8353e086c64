"""The packed token bitmask on logit rows: the compiled op and its numpy reference against an
independent per-token formula (bit t % 32 of word t // 32), bit for bit, and against llguidance's own
numpy kernel."""
import numpy as np
import pytest

from fastdeploy.model_executor.layers.sample.token_bitmask import allowed_tokens, apply_token_bitmask
from fastdeploy.model_executor.ops import fallbacks_forced
from fastdeploy.model_executor.ops.loader import compiled_op
from fastdeploy.model_executor.ops.token_bitmask import apply_token_bitmask_


def per_token_reference(logits, bitmask, indices):
    """The layout written out token by token, in plain Python ints."""
    out = logits.copy()
    words = bitmask.shape[1]
    for i, row in enumerate(indices):
        for t in range(logits.shape[1]):
            w = t // 32
            allowed = w < words and (int(bitmask[i, w]) >> (t % 32)) & 1
            if not allowed:
                out[row, t] = -np.inf
    return out


def random_case(rng, rows, vocab, words, m):
    logits = rng.standard_normal((rows, vocab)).astype(np.float32) * 5
    logits[rng.random((rows, vocab)) < 0.01] = -np.inf  # already banned tokens stay banned
    bitmask = rng.integers(-2**31, 2**31, size=(m, words), dtype=np.int64).astype(np.int32)
    bitmask[:, rng.random(words) < 0.3] = -1  # whole words allowed (the op's fast path)
    bitmask[:, rng.random(words) < 0.3] = 0  # whole words banned
    indices = rng.permutation(rows)[:m].astype(np.int64)
    return logits, bitmask, indices


@pytest.mark.parametrize("rows,vocab,words,m", [(4, 320, 10, 3), (3, 333, 11, 3), (5, 100, 2, 2), (2, 70, 4, 2)])
def test_reference_matches_per_token_formula(rows, vocab, words, m):
    """Vocab a multiple of 32, a partial last word, fewer words than the vocab needs (tokens past the
    mask banned), more words than it needs (the extra bits ignored)."""
    rng = np.random.default_rng(rows * vocab + words)
    logits, bitmask, indices = random_case(rng, rows, vocab, words, m)
    expected = per_token_reference(logits, bitmask, indices)
    got = logits.copy()
    apply_token_bitmask(got, bitmask, indices)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("rows,vocab,words,m", [(32, 49152, 1536, 32), (7, 1000, 32, 5), (3, 333, 11, 3),
                                                 (5, 100, 2, 2), (64, 4099, 129, 40)])
def test_op_matches_reference_bit_for_bit(rows, vocab, words, m):
    assert compiled_op("fd_apply_token_bitmask_") is not None, "the C++ ops are not built"
    rng = np.random.default_rng(vocab + m)
    logits, bitmask, indices = random_case(rng, rows, vocab, words, m)
    expected = logits.copy()
    apply_token_bitmask(expected, bitmask, indices)
    got = logits.copy()
    apply_token_bitmask_(got, bitmask, indices)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    untouched = np.setdiff1d(np.arange(rows), indices)
    np.testing.assert_array_equal(got[untouched].view(np.uint32), logits[untouched].view(np.uint32))


def test_matches_llguidance_numpy_kernel():
    """llguidance's own numpy kernel (one mask row per logits row) agrees on the whole batch."""
    import llguidance.numpy as lnp

    rng = np.random.default_rng(7)
    logits, bitmask, _ = random_case(rng, 6, 2000, 63, 6)
    expected = logits.copy()
    lnp.apply_token_bitmask_inplace(expected, bitmask)
    got = logits.copy()
    apply_token_bitmask_(got, bitmask, np.arange(6))
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_fallback_path_and_allowed_tokens():
    rng = np.random.default_rng(3)
    logits, bitmask, indices = random_case(rng, 4, 96, 3, 4)
    with fallbacks_forced():
        got = logits.copy()
        apply_token_bitmask_(got, bitmask, indices)
    expected = per_token_reference(logits, bitmask, indices)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    allowed = allowed_tokens(bitmask, 96)
    assert allowed.shape == (4, 96)
    assert allowed[0, 5] == bool((int(bitmask[0, 0]) >> 5) & 1)


def test_op_rejects_a_row_outside_the_logits():
    logits = np.zeros((2, 64), np.float32)
    with pytest.raises(Exception, match="outside"):
        apply_token_bitmask_(logits, np.zeros((1, 2), np.int32), np.array([5]))
