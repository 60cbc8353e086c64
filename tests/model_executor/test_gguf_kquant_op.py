"""The compiled `gguf_linear` and `gguf_embedding` ops on GGUF's row-major types (Q5_0, Q5_1, Q2_K..Q6_K),
fd_moe_mlp on K-quant experts, and GGUFConfig's method per type, against gguf-py and numpy.

Oracle: gguf-py's `dequantize` (what transformers loads from a GGUF file) on random but valid blocks
(random quant bytes, small float16 scales: gguf-py has no K-quant quantizer), and float64 numpy matmuls.
The op's weights are gguf-py's float32 values bit for bit, products summed in float32 at every row count
(1e-5 of sum_k |x||w|).
"""
import gguf
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.linear import Linear
from fastdeploy.model_executor.layers.quantization.gguf import GGUFConfig, GGUFLinearMethod
from fastdeploy.model_executor.layers.quantization.packed import bf16_bits
from fastdeploy.model_executor.model_loader.quantized import (Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K,
                                                              Q8_0, ROW_MAJOR_BLOCKS, QuantizedTensor)
from fastdeploy.model_executor.ops import compiled_op

pytestmark = pytest.mark.usefixtures("ops_enabled")  # op tests run the compiled op even when fallbacks are forced

ROW_MAJOR = {"Q5_0": Q5_0, "Q5_1": Q5_1, "Q2_K": Q2_K, "Q3_K": Q3_K, "Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K}
# byte offsets of each block's float16 fields: (scales, signed offsets); scales small and positive
HALF_FIELDS = {Q5_0: ([0], []), Q5_1: ([0], [2]), Q2_K: ([80, 82], []), Q3_K: ([108], []), Q4_K: ([0, 2], []),
               Q5_K: ([0, 2], []), Q6_K: ([208], [])}


def random_blocks(rng, rows: int, cols: int, qtype: int) -> QuantizedTensor:
    values, nbytes = ROW_MAJOR_BLOCKS[qtype]
    blocks = rng.integers(0, 256, (rows, cols // values, nbytes), dtype=np.uint8)
    scales, offsets = HALF_FIELDS[qtype]
    for at in scales:
        blocks[..., at:at + 2] = rng.uniform(0.001, 0.05, blocks.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    for at in offsets:
        blocks[..., at:at + 2] = rng.uniform(-1, 1, blocks.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    return QuantizedTensor(blocks.reshape(rows, -1), qtype, cols)


def quantized(rng, rows: int, cols: int, qtype: int) -> QuantizedTensor:
    if qtype in ROW_MAJOR_BLOCKS:
        return random_blocks(rng, rows, cols, qtype)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    return QuantizedTensor(gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype)), qtype, cols)


def compiled(name):
    found = compiled_op(name)
    assert found is not None, "the compiled custom ops failed to build on this machine (see the log)"
    return found


def weight_of(w: QuantizedTensor) -> paddle.Tensor:
    """The weight as the engine holds it: row-major as stored, Q4_0/Q4_1/Q8_0 interleaved."""
    if w.qtype in ROW_MAJOR_BLOCKS:
        return paddle.to_tensor(w.blocks)
    return compiled("gguf_interleave_rows")(paddle.to_tensor(w.blocks), w.qtype)


def assert_close(y, x, w):
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T) + 1e-30
    assert np.all(np.abs(y - ref) <= bound), f"max error {np.abs(y - ref).max():.3g}"


@pytest.mark.parametrize("name", sorted(ROW_MAJOR))
def test_dequantized_rows_equal_gguf_py_bit_for_bit(name):
    w = random_blocks(np.random.default_rng(3), 37, 512, ROW_MAJOR[name])
    ids = np.array([5, 0, 36, 5, 17], np.int64)
    got = compiled("gguf_embedding")(paddle.to_tensor(ids), weight_of(w), w.qtype, 37, 512).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), w.dequantize()[ids].view(np.uint32))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
def test_interleaved_rows_equal_gguf_py(name):
    w = quantized(np.random.default_rng(4), 13, 96, {"Q4_0": Q4_0, "Q4_1": Q4_1, "Q8_0": Q8_0}[name])
    ids = np.arange(13, dtype=np.int64)[::-1].copy()
    got = compiled("gguf_embedding")(paddle.to_tensor(ids), weight_of(w), w.qtype, 13, 96).numpy()
    np.testing.assert_array_max_ulp(got, w.dequantize()[ids], maxulp=1)


@pytest.mark.parametrize("name", sorted(ROW_MAJOR))
@pytest.mark.parametrize("m", [1, 2, 4, 5, 8, 9, 15, 16, 33, 300])  # row by row, W row pairs (two passes from 9), broadcast
@pytest.mark.parametrize("n,blocks", [(1, 1), (67, 3), (130, 2)])
def test_row_major_op_matches_numpy(name, m, n, blocks):
    qtype = ROW_MAJOR[name]
    k = blocks * ROW_MAJOR_BLOCKS[qtype][0]
    rng = np.random.default_rng(m * 1000 + n + k)
    w = random_blocks(rng, n, k, qtype)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = compiled("gguf_linear")(paddle.to_tensor(x), weight_of(w), qtype, n).numpy()
    assert y.shape == (m, n)
    assert_close(y, x, w.dequantize())


def test_row_major_op_rejects_bad_input():
    rng = np.random.default_rng(5)
    w = random_blocks(rng, 8, 512, Q4_K)
    x = paddle.to_tensor(rng.standard_normal((2, 512)).astype(np.float32))
    op = compiled("gguf_linear")
    with pytest.raises(Exception, match="unsupported GGUF type id 16"):
        op(x, paddle.to_tensor(w.blocks), 16, 8)
    with pytest.raises(Exception, match="does not hold 9 rows of 512 weights of type 12"):
        op(x, paddle.to_tensor(w.blocks), Q4_K, 9)
    with pytest.raises(Exception, match="does not hold 8 rows of 256"):
        op(x[:, :256], paddle.to_tensor(w.blocks), Q4_K, 8)
    embedding = compiled("gguf_embedding")
    with pytest.raises(Exception, match=r"id 8 outside \[0, 8\)"):
        embedding(paddle.to_tensor(np.array([8], np.int64)), paddle.to_tensor(w.blocks), Q4_K, 8, 512)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q5_0"])
def test_gguf_method_keeps_the_files_rows(name):
    """A fused Linear of two shards of one row-major type holds their bytes as they are; its product equals numpy."""
    qtype = ROW_MAJOR[name]
    rng = np.random.default_rng(6)
    parts = [random_blocks(rng, 24, 256, qtype), random_blocks(rng, 8, 256, qtype)]
    method = GGUFConfig({"a.weight": qtype, "b.weight": qtype}).linear_method(["a.weight", "b.weight"])
    assert isinstance(method, GGUFLinearMethod)
    layer = Linear(256, {0: 24, 1: 8}, False, method)
    for i in (1, 0):
        layer.weight_loader(layer.weight, parts[i], i)
    np.testing.assert_array_equal(layer.weight.numpy(), np.concatenate([p.blocks for p in parts]))
    dense = np.concatenate([p.dequantize() for p in parts])
    for m in (2, 100):
        x = rng.standard_normal((m, 256)).astype(np.float32)
        assert_close(layer(paddle.to_tensor(x)).numpy(), x, dense)
    ids = paddle.to_tensor(np.array([31, 0], np.int64))  # a tied embedding's lookup reads the same blocks
    np.testing.assert_array_equal(layer.method.rows(layer, ids).numpy(), dense[[31, 0]])


def test_moe_mlp_with_k_quant_experts_equals_numpy():
    """fd_moe_mlp's experts as Q4_K gate_up and Q6_K down blocks (typed_linear.cc): a float64 reference
    on gguf-py's dequantized weights."""
    hidden, inter, experts, top_k = 256, 256, 4, 2
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, hidden)).astype(np.float32)
    router = (0.5 * rng.standard_normal((hidden, experts))).astype(np.float32)
    gate_ups = [random_blocks(rng, 2 * inter, hidden, Q4_K) for _ in range(experts)]  # [gate | up] rows
    downs = [random_blocks(rng, hidden, inter, Q6_K) for _ in range(experts)]
    absent = paddle.zeros([0], "float32")
    got = compiled("fd_moe_mlp")(
        paddle.to_tensor(x), paddle.to_tensor(router), absent, [weight_of(g) for g in gate_ups],
        [weight_of(d) for d in downs], absent, absent, absent, absent, [Q4_K, Q6_K] * experts, [0, 0],
        top_k, inter, 0, True, 1e-12).numpy()
    logits = x.astype(np.float64) @ router
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = np.zeros(x.shape)
    for t in range(len(x)):
        chosen = sorted(range(experts), key=lambda e: (-p[t, e], e))[:top_k]
        weights = p[t, chosen] / p[t, chosen].sum()
        for e, we in zip(chosen, weights):
            h = gate_ups[e].dequantize().astype(np.float64) @ x[t]
            act = h[:inter] / (1 + np.exp(-h[:inter])) * h[inter:]
            want[t] += we * (downs[e].dequantize().astype(np.float64) @ act)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def write_gguf(path, tensors: dict) -> None:
    """A GGUF file of `tensors` (name: (raw array, ggml type)) as gguf-py writes it."""
    writer = gguf.GGUFWriter(str(path), arch="llama")
    for name, (array, qtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=None if qtype in (0, 1) else gguf.GGMLQuantizationType(qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_quant_config_methods_by_type_and_an_unsupported_type_is_named(tmp_path):
    """Q4_K kept in blocks; BF16, F16, F32 dense float32; an IQ4_NL matrix refused naming it and its type."""
    from fastdeploy.model_executor.layers.linear import UnquantizedLinearMethod
    from fastdeploy.model_executor.model_loader.gguf_file import GGUFFile
    from fastdeploy.model_executor.model_loader.gguf_loader import gguf_quant_config

    rng = np.random.default_rng(12)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    bf16 = bf16_bits(w).view(np.uint8)  # [64, 512]: BF16 rows as the file stores them
    tensors = {"blk.0.attn_q.weight": (random_blocks(rng, 64, 256, Q4_K).blocks, Q4_K),
               "blk.0.attn_k.weight": (bf16, 30), "blk.0.attn_v.weight": (w.astype(np.float16), 1),
               "blk.0.attn_output.weight": (w, 0)}
    write_gguf(tmp_path / "ok.gguf", tensors)
    config = gguf_quant_config(GGUFFile(tmp_path / "ok.gguf"))
    method = lambda name: config.linear_method([f"model.layers.0.self_attn.{name}.weight"])  # noqa: E731
    assert isinstance(method("q_proj"), GGUFLinearMethod) and method("q_proj").qtype == Q4_K
    assert isinstance(method("k_proj"), UnquantizedLinearMethod)  # BF16: float32, as transformers computes
    assert isinstance(method("v_proj"), UnquantizedLinearMethod)  # F16
    assert isinstance(method("o_proj"), UnquantizedLinearMethod)  # F32
    blocks = rng.integers(0, 256, (64, 256 // 32 * 18), dtype=np.uint8)  # IQ4_NL: 32 values in 18 bytes
    write_gguf(tmp_path / "bad.gguf", {"blk.0.attn_q.weight": (blocks, int(gguf.GGMLQuantizationType.IQ4_NL))})
    with pytest.raises(ValueError, match=r"'blk.0.attn_q.weight' is of type IQ4_NL \(20\)"):
        gguf_quant_config(GGUFFile(tmp_path / "bad.gguf"))
