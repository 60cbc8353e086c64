"""The compiled `vision_attention_bf16` op (each kernel: AMX tiles where the CPU and Linux allow them, AVX512-BF16
registers where compiled, portable loops everywhere) and its Paddle reference against float64 numpy computed from
the same bf16 values: q, k, v rounded to bf16 (nearest even), s = q k^T * scale, p = exp(s - max) rounded to bf16,
out = (bf16(p) v) / sum(p).

Tolerance. Products of bf16 values are exact in float32 and float64; what differs is float32 summation (q.k over
head_dim, the sums over keys: ~1e-6 relative) and the online softmax: the op rounds exp(s - running max) per block
of 128 keys, the reference exp(s - global max). Both roundings are within 2^-9 of the same exact p, so each
rounded p of the op is within 2^-8 p of the reference's and, as sum(p) / l = 1, |out - ref| <= 2^-8 max|v| (plus
the float32 part). Segments up to one block (128 keys) have running max = global max from the first step, so
there the two round the same numbers and only summation order (and a rare rounding flip of one p) remains: 2e-4
of max|v| (a flip moves one term by 2^-8 p_k |v_k| / l, far under that for all but a dominant key).

Sizes: segment lengths 1, 15, 64, 97, 300 and several in one call reach the op's tails (32-query items, keys
padded to 32, 128-key blocks); head_dim 16, 64, 80, 128 (80 and 16 pad the contraction to 32 and 96)."""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.ops import compiled_op, fallbacks_forced
from fastdeploy.model_executor.ops.vision_attention import (KERNELS, paddle_vision_attention, vision_attention,
                                                            vision_attention_bf16)

BLOCK = 128  # the op's keys per softmax step (kBlock in custom_ops/cpu_ops/vision_attention_bf16.cc)
SEGMENTS = [[1], [15], [64], [97], [300], [1, 15, 64, 97, 300, 33]]


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bf16 value (ties to even), as float64."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return rounded.view(np.float32).astype(np.float64)


def reference(qkv: np.ndarray, cu: np.ndarray, heads: int, scale: float) -> np.ndarray:
    n, dim = qkv.shape[0], qkv.shape[1] // (3 * heads)
    q, k, v = bf16(qkv).reshape(n, 3, heads, dim).transpose(1, 2, 0, 3)  # [heads, n, dim] each
    out = np.zeros((heads, n, dim))
    for a, b in zip(cu[:-1], cu[1:]):
        s = q[:, a:b] @ k[:, a:b].transpose(0, 2, 1) * scale
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, a:b] = bf16(p) @ v[:, a:b] / p.sum(-1, keepdims=True)
    return out.transpose(1, 0, 2).reshape(n, heads * dim)


def run(qkv, cu, heads, scale, kernel):
    return vision_attention_bf16(paddle.to_tensor(qkv), paddle.to_tensor(cu), heads, scale, kernel).numpy()


@pytest.mark.parametrize("segments", SEGMENTS, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("heads, dim", [(3, 80), (1, 16), (3, 64), (1, 128)])
def test_every_kernel_matches_float64_on_bf16_values(ops_enabled, segments, heads, dim):
    assert compiled_op("vision_attention_bf16") is not None
    rng = np.random.default_rng(dim + len(segments))
    cu = np.concatenate([[0], np.cumsum(segments)]).astype(np.int64)
    qkv = (rng.standard_normal((cu[-1], 3 * heads * dim)) * 1.5).astype(np.float32)
    expected = reference(qkv, cu, heads, dim**-0.5)
    v_max = np.abs(bf16(qkv)[:, 2 * heads * dim:]).max()
    one_block = max(segments) <= BLOCK
    tolerance = (2e-4 if one_block else 2**-8 + 1e-5) * v_max
    outputs = {kernel: run(qkv, cu, heads, dim**-0.5, kernel) for kernel in KERNELS}
    outputs["paddle"] = paddle_vision_attention(paddle.to_tensor(qkv), cu, heads, dim**-0.5, bf16=True).numpy()
    for name, out in outputs.items():
        assert np.abs(out - expected).max() <= tolerance, name
    # bf16 moved it: the float32 op's result is further than the tight bar from these
    exact = vision_attention(paddle.to_tensor(qkv), paddle.to_tensor(cu), heads, dim**-0.5).numpy()
    assert np.abs(exact - expected).max() > 2e-4 * v_max


def test_segments_are_isolated(ops_enabled):
    rng = np.random.default_rng(1)
    cu = np.array([0, 40, 140], np.int64)
    qkv = rng.standard_normal((140, 3 * 2 * 80)).astype(np.float32)
    before = run(qkv, cu, 2, 0.1, "best")
    qkv[40:, 2 * 80:] += 1.0  # the second segment's keys and values
    after = run(qkv, cu, 2, 0.1, "best")
    assert np.array_equal(after[:40], before[:40]) and not np.allclose(after[40:], before[40:])


def test_fallback_is_the_paddle_reference(ops_enabled):
    rng = np.random.default_rng(2)
    cu = np.array([0, 70], np.int64)
    qkv = rng.standard_normal((70, 3 * 32)).astype(np.float32)
    with fallbacks_forced():
        forced = vision_attention_bf16(paddle.to_tensor(qkv), paddle.to_tensor(cu), 1, 0.2).numpy()
    assert np.abs(forced - reference(qkv, cu, 1, 0.2)).max() <= 2e-4 * np.abs(bf16(qkv)[:, 64:]).max()


@pytest.mark.parametrize("width, heads, cu, message", [
    (3 * 16, 1, [0, 5], "cu_seqlens"), (3 * 16, 1, [0, 0, 6], "empty"), (3 * 24, 1, [0, 6], "head_dim 24"),
    (3 * 16 + 1, 1, [0, 6], "width")])
def test_bad_inputs_raise(ops_enabled, width, heads, cu, message):
    qkv = paddle.zeros([6, width])
    with pytest.raises(OSError, match=message):
        vision_attention_bf16(qkv, paddle.to_tensor(np.asarray(cu, np.int64)), heads, 0.25)


def test_unknown_kernel_raises():
    with pytest.raises(ValueError, match="kernel"):
        vision_attention_bf16(paddle.zeros([2, 48]), paddle.to_tensor(np.array([0, 2], np.int64)), 1, 0.25, "fast")
