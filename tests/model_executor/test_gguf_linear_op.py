"""The compiled `gguf_linear` op and LinearWeight against gguf-py's dequantization and numpy matmuls.

Oracle: gguf-py's reference `quantize`/`dequantize` (the values transformers loads from a GGUF) and a
float64 numpy matmul. Tolerances: the dequantized weights must equal gguf-py's within 1 ulp (the AVX-512
path reproduces them exactly); matmuls agree within 1e-5 relative to sum_k |x||w| (float32 sums in another
order).
"""
import gguf
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.linear import DENSE_FROM_ROWS, LinearWeight
from fastdeploy.model_executor.model_loader.quantized import (Q4_0, Q4_1, Q8_0, QuantizedTensor,
                                                              blocks_from_interleaved)
from fastdeploy.model_executor.ops import compiled_op, fallbacks_forced

pytestmark = pytest.mark.usefixtures("ops_enabled")  # op tests run the compiled op even when fallbacks are forced

QTYPES = {"Q4_0": Q4_0, "Q4_1": Q4_1, "Q8_0": Q8_0}


def quantized(rng, rows, cols, qtype) -> QuantizedTensor:
    w = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 2.0, (rows, 1)).astype(np.float32)
    w[:, :32] += 0.5  # blocks with an offset (Q4_1's minimum m matters)
    return QuantizedTensor(gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype)), qtype, cols)


def assert_matmul_close(y, x, w):
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T) + 1e-30
    assert np.all(np.abs(y - ref) <= bound), f"max error {np.abs(y - ref).max():.3g}"


def compiled(name):
    found = compiled_op(name)
    assert found is not None, "the compiled custom ops failed to build on this machine (see the log)"
    return found


def linear(x: np.ndarray, w: QuantizedTensor) -> np.ndarray:
    """The op on w's blocks after gguf_interleave_rows, as the engine runs it."""
    packed = compiled("gguf_interleave_rows")(paddle.to_tensor(w.blocks), w.qtype)
    return compiled("gguf_linear")(paddle.to_tensor(x), packed, w.qtype, w.shape[0]).numpy()


@pytest.mark.parametrize("name", sorted(QTYPES))
@pytest.mark.parametrize("rows", [1, 4, 7, 37])
def test_interleaved_layout_round_trips_to_gguf_blocks(name, rows):
    w = quantized(np.random.default_rng(rows), rows, 96, QTYPES[name])
    packed = compiled("gguf_interleave_rows")(paddle.to_tensor(w.blocks), w.qtype).numpy()
    assert packed.shape[0] == -(-rows // 4)
    np.testing.assert_array_equal(blocks_from_interleaved(packed, w.qtype, rows), w.blocks)


@pytest.mark.parametrize("name", sorted(QTYPES))
def test_dequantized_weights_equal_gguf_py(name):
    rng = np.random.default_rng(1)
    w = quantized(rng, 37, 96, QTYPES[name])
    eye = paddle.eye(96)  # y = I @ W^T = W^T: every weight through the op alone
    got = linear(eye.numpy(), w).T
    np.testing.assert_array_max_ulp(got, w.dequantize(), maxulp=1)


@pytest.mark.parametrize("name", sorted(QTYPES))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 17, 64])
@pytest.mark.parametrize("n,k", [(1, 32), (7, 96), (16, 576), (33, 1536), (600, 64)])
def test_op_matches_numpy_matmul(name, m, n, k):
    rng = np.random.default_rng(m * 1000 + n + k)
    w = quantized(rng, n, k, QTYPES[name])
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = linear(x, w)
    assert y.shape == (m, n)
    assert_matmul_close(y, x, w.dequantize())


def test_op_keeps_leading_dims_and_rejects_bad_input():
    rng = np.random.default_rng(2)
    w = quantized(rng, 8, 64, Q8_0)
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    y = linear(x, w)
    assert y.shape == (2, 3, 8)
    assert_matmul_close(y.reshape(6, 8), x.reshape(6, 64), w.dequantize())
    packed = compiled("gguf_interleave_rows")(paddle.to_tensor(w.blocks), w.qtype)
    op = compiled("gguf_linear")
    with pytest.raises(Exception, match="unsupported GGUF type"):
        op(paddle.to_tensor(x), packed, 12, 8)
    with pytest.raises(Exception, match="does not hold 8 interleaved rows of 32"):
        op(paddle.to_tensor(x[..., :32]), packed, w.qtype, 8)
    with pytest.raises(Exception, match="does not hold 9 interleaved rows"):
        op(paddle.to_tensor(x), packed, w.qtype, 9)
    with pytest.raises(Exception, match="not whole blocks"):
        compiled("gguf_interleave_rows")(paddle.to_tensor(w.blocks[:, :-1]), w.qtype)


def fused(rng, parts):
    """A LinearWeight of len(parts) row ranges loaded in shuffled order; returns it and the dense [out, in]."""
    k = 64
    weight = LinearWeight(k, sum(rows for rows, _ in parts))
    pieces, start = [], 0
    for rows, qtype in parts:
        piece = quantized(rng, rows, k, qtype) if qtype else rng.standard_normal((rows, k)).astype(np.float32)
        pieces.append(((start, start + rows), piece))
        start += rows
    for i in rng.permutation(len(pieces)):
        weight.load(*pieces[i])
    dense = np.concatenate([p.dequantize() if isinstance(p, QuantizedTensor) else p for _, p in pieces])
    return weight, dense


@pytest.mark.parametrize("parts,kept_quantized", [
    ([(24, Q4_1), (8, Q4_1), (8, Q4_1)], True),   # qkv-like, one type: one block matrix
    ([(16, Q8_0)], True),
    ([(24, Q4_1), (8, Q8_0), (8, Q4_1)], False),  # mixed types: dequantized
    ([(24, Q4_1), (8, None), (8, Q4_1)], False),  # a float part: dequantized
])
def test_linear_weight_assembles_parts_in_row_order(parts, kept_quantized):
    rng = np.random.default_rng(len(parts))
    weight, dense = fused(rng, parts)
    compiled("gguf_linear")  # the compiled op is built, so only the types decide
    assert (weight.blocks is not None) == kept_quantized and (weight.dense is None) == kept_quantized
    x = rng.standard_normal((5, 64)).astype(np.float32)
    assert_matmul_close(weight(paddle.to_tensor(x)).numpy(), x, dense)


def test_linear_weight_with_fallbacks_forced_is_dense_and_equal():
    rng = np.random.default_rng(7)
    with fallbacks_forced():
        weight, dense = fused(rng, [(24, Q4_1), (16, Q4_1)])
    assert weight.blocks is None and weight.dense is not None
    np.testing.assert_array_equal(weight.dense.numpy(), dense.T)


def test_linear_weight_rejects_a_wrong_shape():
    weight = LinearWeight(64, 16)
    with pytest.raises(ValueError, match=r"has shape \[16, 32\], expected \[16, 64\]"):
        weight.load(None, np.zeros((16, 32), np.float32))


def test_quantized_weight_uses_a_dense_copy_from_many_rows():
    rng = np.random.default_rng(8)
    weight, dense = fused(rng, [(24, Q4_1), (8, Q4_1)])
    few = rng.standard_normal((DENSE_FROM_ROWS - 1, 64)).astype(np.float32)
    assert_matmul_close(weight(paddle.to_tensor(few)).numpy(), few, dense)
    assert weight.dense is None  # few rows: computed on the blocks
    many = rng.standard_normal((DENSE_FROM_ROWS, 64)).astype(np.float32)
    assert_matmul_close(weight(paddle.to_tensor(many)).numpy(), many, dense)
    assert weight.blocks is not None
    np.testing.assert_array_equal(weight.dense.numpy(), dense.T)  # exactly the dequantized weights
