"""The compiled RMSNorm, fused add + RMSNorm, rotary embedding and SwiGLU ops against their pure-Paddle
fallbacks (fastdeploy/model_executor/ops/) and against numpy float64 references.

Tolerances (float32 inputs of standard-normal scale):
- rms_norm, fused_add_rms_norm: |got - ref| <= 1e-5 * max|ref| (float32 sum of squares in another
  order, rsqrt); new_residual is x + residual exactly, on both paths.
- rotary_embedding_: both paths within 1e-6 * max|qkv| of the float64 reference and of each other
  (one rounding of a*cos + b*sin, fused or not); v columns bit-identical; qkv rotated in place.
- silu_and_mul: |got - ref| <= 2e-6 * |ref| per element (plus 1e-37 for underflow) for gates in
  [-80, 80], including a dense sweep of that range (the op's own exp).
- quick_gelu: |got - ref| <= (2e-6 + 1.702 |x| 2^-24) * |ref| (plus 1e-37) for x in [-50, 80] (a dense
  sweep; sizes with a partial last vector and several of the op's 2^14-element chunks): the second
  term is the float32 rounding of exp's argument 1.702 x, which any float32 implementation makes.
"""
import functools

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.rotary_embedding import RotaryEmbedding
from fastdeploy.model_executor.ops import compiled_op, fallbacks_forced
from fastdeploy.model_executor.ops.activation import quick_gelu, silu_and_mul
from fastdeploy.model_executor.ops.normalization import fused_add_rms_norm, rms_norm
from fastdeploy.model_executor.ops.rotary_embedding import rotary_embedding_

MAX_POSITION = 1 << 16
PATHS = ["compiled", "fallback"]


OP_OF = {rms_norm: "fd_rms_norm", fused_add_rms_norm: "fd_fused_add_rms_norm",
         rotary_embedding_: "fd_rotary_embedding", silu_and_mul: "fd_silu_and_mul",
         quick_gelu: "fd_quick_gelu"}


def run(path: str, shim, *args):
    """shim(*args) through its compiled op (asserted to exist) or with the fallbacks forced."""
    with fallbacks_forced(path == "fallback"):
        if path == "compiled":
            assert compiled_op(OP_OF[shim]) is not None, "the compiled CPU ops failed to build (see the log)"
        return shim(*args)


def rms_reference(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [1, 7, 32, 300])
@pytest.mark.parametrize("hidden", [576, 896, 4096])
def test_rms_norm(path, n, hidden):
    rng = np.random.default_rng(n * hidden)
    x = rng.standard_normal((n, hidden), dtype=np.float32) * 3
    weight = rng.standard_normal(hidden, dtype=np.float32)
    expected = rms_reference(x, weight, 1e-6)
    got = run(path, rms_norm, paddle.to_tensor(x), paddle.to_tensor(weight), 1e-6).numpy()
    assert got.shape == x.shape
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [1, 7, 300])
@pytest.mark.parametrize("heads,head_dim", [(12, 64), (20, 128)])
def test_rms_norm_per_head(path, n, heads, head_dim):
    """[n, heads, head_dim] normalised over head_dim, as Qwen3's q/k norms."""
    rng = np.random.default_rng(n + heads)
    x = rng.standard_normal((n, heads, head_dim), dtype=np.float32)
    weight = rng.standard_normal(head_dim, dtype=np.float32)
    expected = rms_reference(x, weight, 1e-5)
    got = run(path, rms_norm, paddle.to_tensor(x), paddle.to_tensor(weight), 1e-5).numpy()
    assert got.shape == x.shape
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [1, 7, 32, 300])
@pytest.mark.parametrize("hidden", [576, 896, 4096])
def test_fused_add_rms_norm(path, n, hidden):
    rng = np.random.default_rng(n * hidden + 1)
    x = rng.standard_normal((n, hidden), dtype=np.float32)
    residual = rng.standard_normal((n, hidden), dtype=np.float32) * 10
    weight = rng.standard_normal(hidden, dtype=np.float32)
    x_t, residual_t = paddle.to_tensor(x), paddle.to_tensor(residual)
    out, new_residual = run(path, fused_add_rms_norm, x_t, residual_t, paddle.to_tensor(weight), 1e-5)
    np.testing.assert_array_equal(new_residual.numpy(), x + residual)
    expected = rms_reference(x + residual, weight, 1e-5)
    assert np.abs(out.numpy() - expected).max() <= 1e-5 * np.abs(expected).max()
    np.testing.assert_array_equal(x_t.numpy(), x)  # inputs untouched
    np.testing.assert_array_equal(residual_t.numpy(), residual)


@functools.lru_cache(maxsize=None)
def rope_for(head_dim: int) -> RotaryEmbedding:
    return RotaryEmbedding(head_dim, 500000.0, MAX_POSITION, None)


def rotary_reference(qkv: np.ndarray, positions: np.ndarray, rope: RotaryEmbedding, rotated: int) -> np.ndarray:
    """float64 rotate-half from the tables: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]."""
    n, dim = qkv.shape[0], rope.cos.shape[1]
    half = dim // 2
    rows = paddle.to_tensor(positions)
    cos = paddle.gather(rope.cos, rows).numpy()[:, None, :half].astype(np.float64)  # [n, 1, half]
    sin = paddle.gather(rope.sin_signed, rows).numpy()[:, None, half:].astype(np.float64)  # [n, 1, half]
    out = qkv.astype(np.float64)
    heads = out[:, : rotated * dim].reshape(n, rotated, dim)  # a view into out
    x1, x2 = heads[..., :half].copy(), heads[..., half:].copy()
    heads[..., :half] = x1 * cos - x2 * sin
    heads[..., half:] = x2 * cos + x1 * sin
    return out


def random_positions(rng, n: int) -> np.ndarray:
    positions = rng.integers(0, MAX_POSITION, n)
    positions[: min(n, 3)] = [0, MAX_POSITION - 1, 1][: min(n, 3)]
    return positions.astype(np.int64)


@pytest.mark.parametrize("n", [1, 7, 32, 300])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3), (16, 2)])
def test_rotary_embedding(n, head_dim, num_heads, num_kv_heads):
    rng = np.random.default_rng(n * head_dim + num_heads)
    rope, rotated = rope_for(head_dim), num_heads + num_kv_heads
    qkv = rng.standard_normal((n, (rotated + num_kv_heads) * head_dim), dtype=np.float32)
    positions = random_positions(rng, n)
    expected = rotary_reference(qkv, positions, rope, rotated)
    tolerance = 1e-6 * np.abs(qkv).max()
    results = {}
    for path in PATHS:
        tensor = paddle.to_tensor(qkv)
        returned = run(path, rotary_embedding_, tensor, paddle.to_tensor(positions), rope.cos, rope.sin_signed,
                       num_heads, num_kv_heads, head_dim)
        assert returned is tensor
        results[path] = got = tensor.numpy()
        assert np.abs(got - expected).max() <= tolerance, path
        np.testing.assert_array_equal(got[:, rotated * head_dim :], qkv[:, rotated * head_dim :])  # v
    assert np.abs(results["compiled"] - results["fallback"]).max() <= tolerance


@pytest.mark.parametrize("path", PATHS)
def test_rotary_embedding_refuses_strided_views(path):
    rope = rope_for(64)
    view = paddle.zeros([4, 15 * 64])[:, : 12 * 64]
    with pytest.raises(ValueError, match="contiguous"):
        run(path, rotary_embedding_, view, paddle.to_tensor(np.arange(4)), rope.cos, rope.sin_signed, 9, 3, 64)


def test_rotary_embedding_op_checks_positions():
    rope = rope_for(64)
    positions = paddle.to_tensor(np.array([0, MAX_POSITION], np.int64))
    with pytest.raises(Exception, match="outside the tables"):
        run("compiled", rotary_embedding_, paddle.zeros([2, 15 * 64]), positions, rope.cos, rope.sin_signed, 9, 3, 64)


def silu_and_mul_reference(gate_up: np.ndarray) -> np.ndarray:
    inter = gate_up.shape[1] // 2
    gate, up = gate_up[:, :inter].astype(np.float64), gate_up[:, inter:].astype(np.float64)
    return gate / (1.0 + np.exp(-gate)) * up


def assert_silu_close(got: np.ndarray, expected: np.ndarray):
    assert got.shape == expected.shape
    assert np.all(np.abs(got - expected) <= 2e-6 * np.abs(expected) + 1e-37)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n", [1, 7, 32, 300])
@pytest.mark.parametrize("inter", [8, 1000, 1536, 4864])
def test_silu_and_mul(path, n, inter):
    """Random gates of scale 4; inter 8 and 1000 exercise the op's partial last vector."""
    rng = np.random.default_rng(n * inter)
    gate_up = rng.standard_normal((n, 2 * inter), dtype=np.float32) * 4
    got = run(path, silu_and_mul, paddle.to_tensor(gate_up)).numpy()
    assert_silu_close(got, silu_and_mul_reference(gate_up))


@pytest.mark.parametrize("path", PATHS)
def test_silu_and_mul_over_the_whole_gate_range(path):
    """A dense sweep of gates in [-80, 80] (2^20 values): exp's range reduction at every exponent."""
    rng = np.random.default_rng(0)
    gate = np.linspace(-80, 80, 1 << 20, dtype=np.float32).reshape(64, -1)
    gate_up = np.concatenate([gate, rng.standard_normal(gate.shape, dtype=np.float32)], axis=1)
    got = run(path, silu_and_mul, paddle.to_tensor(gate_up)).numpy()
    assert_silu_close(got, silu_and_mul_reference(gate_up))


def test_silu_and_mul_op_at_extreme_gates():
    """Past exp's clamp the op stays finite: silu(g) ~ g for large g, ~0 (under 1e-30) for very negative g."""
    gate = np.array([[-1e4, -200, -88, 88, 200, 1e4]], np.float32)
    got = run("compiled", silu_and_mul, paddle.to_tensor(np.concatenate([gate, np.ones_like(gate)], 1))).numpy()
    assert np.all(np.abs(got[0, :3]) < 1e-30)
    np.testing.assert_array_equal(got[0, 3:], gate[0, 3:])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", [(1,), (7, 3), (3, 40000), (64, 1 << 14)])
def test_quick_gelu(path, shape):
    """x * sigmoid(1.702 x) against float64: random x of scale 4, and a dense sweep of [-50, 80]."""
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32) * 4
    if x.size == 1 << 20:
        x = np.linspace(-50, 80, x.size, dtype=np.float32).reshape(shape)
    expected = x.astype(np.float64) / (1 + np.exp(-1.702 * x.astype(np.float64)))
    got = run(path, quick_gelu, paddle.to_tensor(x)).numpy()
    assert got.shape == x.shape
    bound = (2e-6 + 1.702 * np.abs(x) * 2.0**-24) * np.abs(expected) + 1e-37
    assert np.all(np.abs(got - expected) <= bound)
