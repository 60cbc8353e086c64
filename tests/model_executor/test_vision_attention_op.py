"""The compiled `vision_attention` op and its Paddle reference against float64 numpy (3e-6 of the largest output): non-causal
softmax(q k^T * scale) v per head within each segment; bad inputs raise.

Sizes reach every tail of the op's blocking (custom_ops/cpu_ops/vision_attention.cc): segment lengths
1 .. 200 end their last query tile (64 queries) at 1, 3, 63, 64, 65 - 64, 96 - 64, 97 - 64, 130 - 128
and 200 - 192 rows, their last key block (96 keys) at every count modulo the 6-key score tile (0 .. 5),
and head_dim 80, 24, 16, 12 and 8 split into 5-column value tiles with tails of 0, 4, 1, 2 and 3."""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.ops import compiled_op, fallbacks_forced
from fastdeploy.model_executor.ops.vision_attention import paddle_vision_attention, vision_attention

SEGMENTS = [1, 3, 63, 64, 65, 96, 97, 130, 200]


def reference(qkv: np.ndarray, cu: np.ndarray, heads: int, scale: float) -> np.ndarray:
    n, dim = qkv.shape[0], qkv.shape[1] // (3 * heads)
    q, k, v = qkv.astype(np.float64).reshape(n, 3, heads, dim).transpose(1, 2, 0, 3)
    out = np.zeros((heads, n, dim))
    for a, b in zip(cu[:-1], cu[1:]):
        s = q[:, a:b] @ k[:, a:b].transpose(0, 2, 1) * scale
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, a:b] = p / p.sum(-1, keepdims=True) @ v[:, a:b]
    return out.transpose(1, 0, 2).reshape(n, heads * dim)


@pytest.mark.parametrize("heads, dim", [(3, 80), (1, 24), (2, 16), (2, 12), (1, 8)])
def test_matches_float64(ops_enabled, heads, dim):
    assert compiled_op("vision_attention") is not None
    rng = np.random.default_rng(dim)
    cu = np.concatenate([[0], np.cumsum(SEGMENTS)]).astype(np.int64)
    qkv = (rng.standard_normal((cu[-1], 3 * heads * dim)) * 2).astype(np.float32)
    expected = reference(qkv, cu, heads, dim**-0.5)
    compiled = vision_attention(paddle.to_tensor(qkv), paddle.to_tensor(cu), heads, dim**-0.5).numpy()
    fallback = paddle_vision_attention(paddle.to_tensor(qkv), cu, heads, dim**-0.5).numpy()
    with fallbacks_forced():
        forced = vision_attention(paddle.to_tensor(qkv), paddle.to_tensor(cu), heads, dim**-0.5).numpy()
    tolerance = 3e-6 * np.abs(expected).max()  # float32 accumulation over up to 200 keys
    for out in (compiled, fallback, forced):
        assert np.abs(out - expected).max() <= tolerance
    # segments are isolated: changing the last segment's keys leaves the others' outputs alone
    qkv[cu[-2]:, heads * dim:] += 1.0
    changed = vision_attention(paddle.to_tensor(qkv), paddle.to_tensor(cu), heads, dim**-0.5).numpy()
    assert np.array_equal(changed[: cu[-2]], compiled[: cu[-2]]) and not np.allclose(changed[cu[-2]:], compiled[cu[-2]:])


@pytest.mark.parametrize("cu, message", [([0, 5], "cu_seqlens"), ([0, 0, 6], "empty"), ([0, 3], "cu_seqlens")])
def test_bad_segments_raise(ops_enabled, cu, message):
    qkv = paddle.zeros([6, 3 * 16])
    with pytest.raises(OSError, match=message):
        vision_attention(qkv, paddle.to_tensor(np.asarray(cu, np.int64)), 1, 0.25)
