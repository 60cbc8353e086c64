"""The compiled `gguf_linear` op and the GGUF linear method against gguf-py's dequantization and numpy matmuls.

Oracle: gguf-py's reference `quantize`/`dequantize` (the values transformers loads from a GGUF) and a
float64 numpy matmul. Tolerances: the dequantized weights must equal gguf-py's within 1 ulp (the AVX-512
path reproduces them exactly); matmuls agree within 1e-5 relative to sum_k |x||w| (float32 sums in another
order).
"""
import gguf
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.linear import Linear, UnquantizedLinearMethod
from fastdeploy.model_executor.layers.quantization.gguf import GGUFConfig, GGUFLinearMethod, SegmentedGGUFLinearMethod
from fastdeploy.model_executor.model_loader.quantized import (INTERLEAVED_BLOCKS, Q4_0, Q4_1, Q8_0, ROW_GROUP,
                                                              QuantizedTensor)
from fastdeploy.model_executor.ops import compiled_op, fallbacks_forced

pytestmark = pytest.mark.usefixtures("ops_enabled")  # op tests run the compiled op even when fallbacks are forced

QTYPES = {"Q4_0": Q4_0, "Q4_1": Q4_1, "Q8_0": Q8_0}


def quantized(rng, rows, cols, qtype) -> QuantizedTensor:
    w = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 2.0, (rows, 1)).astype(np.float32)
    w[:, :32] += 0.5  # blocks with an offset (Q4_1's minimum m matters)
    return QuantizedTensor(gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype)), qtype, cols)


def blocks_from_interleaved(packed: np.ndarray, qtype: int, rows: int) -> np.ndarray:
    """GGUF's row-major blocks [rows, in / 32 * block bytes] back from the compiled op's layout.

    packed: [ceil(rows / 4), in / 32 * group bytes] uint8 from `gguf_interleave_rows`
    (custom_ops/cpu_ops/gguf_linear.cc): rows in groups of 4, per group and block column the 4 rows'
    scales d as float32, then (Q4_1) their minimums m as float32, then their 4 quant runs. The scales
    came from float16, so converting back is exact.
    """
    headers, quant = INTERLEAVED_BLOCKS[qtype]
    scales = headers // 2  # 1 (d) or 2 (d, m)
    groups, row_bytes = packed.shape
    group_bytes = 16 * scales + ROW_GROUP * quant
    columns = packed.reshape(groups, row_bytes // group_bytes, group_bytes)
    floats = np.ascontiguousarray(columns[:, :, : 16 * scales]).view(np.float32)  # [groups, columns, scales * 4]
    halves = floats.reshape(groups, -1, scales, ROW_GROUP).transpose(0, 1, 3, 2).astype(np.float16)
    quants = columns[:, :, 16 * scales :].reshape(groups, -1, ROW_GROUP, quant)
    blocks = np.concatenate([np.ascontiguousarray(halves).view(np.uint8), quants], axis=-1)  # [g, col, 4, bytes]
    return np.ascontiguousarray(blocks.transpose(0, 2, 1, 3)).reshape(groups * ROW_GROUP, -1)[:rows]


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
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 17, 64, 130])  # every narrow kernel, two passes of rows
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
        op(paddle.to_tensor(x), packed, 16, 8)
    with pytest.raises(Exception, match="does not hold 8 interleaved rows of 32"):
        op(paddle.to_tensor(x[..., :32]), packed, w.qtype, 8)
    with pytest.raises(Exception, match="does not hold 9 interleaved rows"):
        op(paddle.to_tensor(x), packed, w.qtype, 9)
    with pytest.raises(Exception, match="not whole blocks"):
        compiled("gguf_interleave_rows")(paddle.to_tensor(w.blocks[:, :-1]), w.qtype)


def gguf_linear_layer(k: int, parts: list) -> Linear:
    """A Linear packing len(parts) checkpoint tensors (rows, ggml type or None for float), its method
    chosen as the model does from the types a GGUF header gives."""
    types = {f"part{i}.weight": qtype for i, (_, qtype) in enumerate(parts) if qtype}
    method = GGUFConfig(types).linear_method([f"part{i}.weight" for i in range(len(parts))])
    return Linear(k, {i: rows for i, (rows, _) in enumerate(parts)}, False, method)


def fused(rng, parts):
    """A Linear of len(parts) row ranges loaded in shuffled order; returns it and the dense [out, in]."""
    k = 64
    layer = gguf_linear_layer(k, parts)
    pieces = [quantized(rng, rows, k, qtype) if qtype else rng.standard_normal((rows, k)).astype(np.float32)
              for rows, qtype in parts]
    for i in rng.permutation(len(pieces)):
        layer.weight_loader(layer.weight, pieces[i], int(i))
    dense = np.concatenate([p.dequantize() if isinstance(p, QuantizedTensor) else p for p in pieces])
    return layer, dense


@pytest.mark.parametrize("parts,method", [
    ([(24, Q4_1), (8, Q4_1), (8, Q4_1)], GGUFLinearMethod),   # qkv-like, one type: one block matrix
    ([(16, Q8_0)], GGUFLinearMethod),
    ([(7, Q4_0), (6, Q4_0)], GGUFLinearMethod),  # shards not multiples of the 4-row groups; 13 rows: a partial group
    ([(24, Q4_1), (8, Q8_0), (8, Q4_1)], SegmentedGGUFLinearMethod),  # mixed types: each part in its blocks
    ([(24, Q4_1), (8, None), (8, Q4_1)], UnquantizedLinearMethod),  # a float part: dequantized
])
def test_gguf_method_assembles_parts_in_row_order(parts, method):
    rng = np.random.default_rng(len(parts))
    layer, dense = fused(rng, parts)
    assert type(layer.method) is method  # the compiled op is built: types decide
    assert layer.weight.dtype == (paddle.float32 if method is UnquantizedLinearMethod else paddle.uint8)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    assert_matmul_close(layer(paddle.to_tensor(x)).numpy(), x, dense)


def test_gguf_method_with_fallbacks_forced_is_dense_and_equal():
    rng = np.random.default_rng(7)
    with fallbacks_forced():
        layer, dense = fused(rng, [(24, Q4_1), (16, Q4_1)])
    assert isinstance(layer.method, UnquantizedLinearMethod)
    np.testing.assert_array_equal(layer.weight.numpy(), dense.T)


def test_linear_rejects_a_wrong_shape_and_a_type_the_header_did_not_announce():
    layer = Linear(64, {None: 16}, False, UnquantizedLinearMethod())
    with pytest.raises(ValueError, match=r"has shape \[16, 32\], expected \[16, 64\]"):
        layer.weight_loader(layer.weight, np.zeros((16, 32), np.float32))
    layer = gguf_linear_layer(64, [(16, Q4_1)])
    with pytest.raises(ValueError, match="GGUF type 8, but the file's header announced type 3"):
        layer.weight_loader(layer.weight, quantized(np.random.default_rng(9), 16, 64, Q8_0), 0)


def test_quantized_weight_stays_in_blocks_and_float32_for_many_rows():
    """At any row count: float32 kernels on the blocks, no dense copy of the weight."""
    rng = np.random.default_rng(8)
    layer, dense = fused(rng, [(24, Q4_1), (8, Q4_1)])
    for rows in (63, 64, 300):
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        assert_matmul_close(layer(paddle.to_tensor(x)).numpy(), x, dense)
        assert layer.method.operand(layer, rows)[1] == Q4_1
    assert [p.dtype for p in layer.parameters()] == [paddle.uint8]
