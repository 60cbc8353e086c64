"""`fd_decoder_layers` (a run of decoder layers in one compiled op call) against the layer-by-layer path.

Oracle: the same model run layer by layer through the single ops (its plan of runs replaced by the
layers themselves, each through DecoderLayer.forward), which the transformers comparisons in
test_llama_vs_transformers.py, test_model_zoo_vs_transformers.py and test_default_model_greedy.py check.
The fused op calls the same kernels in the same order, so logits must be bit-identical: on a tiny
dense Llama (weights through Paddle's matmul), on the default GGUF model (Q4_1 blocks through
gguf_linear; Q8_0 lm_head), and on tiny random Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm)
and ERNIE-4.5 with use_bias (biases on every linear) in every weight format (float32, bf16, wint8,
wint4, and GGUF Q8_0 / Q4_0 blocks requantized from the float32 weights), for prefills with cached
history and for decode steps; and on tiny random MoE models (ERNIE-4.5-MoE with shared experts,
Qwen3-MoE with and without top-k renormalisation) in float32, bf16, wint8 and wint4. Which layers the
plan fuses: every layer of those, dense and MoE.
"""
import numpy as np
import pytest

from fastdeploy import LLM
from fastdeploy.model_executor.layers.fused_decoder_layers import (FusedDecoderLayers, consecutive_runs,
                                                                   plan_layer_runs)
from fastdeploy.model_executor.layers.mlp import DenseMLP
from fastdeploy.model_executor.layers.moe import SparseMoE
from fastdeploy.model_executor.layers.quantization.gguf import GGUFLinearMethod
from fastdeploy.model_executor.layers.quantization.packed import KIND_IDS
from fastdeploy.model_executor.model_loader.quantized import QuantizedTensor
from fastdeploy.model_executor.ops import compiled_op

from runner_access import forward_logits, model_runner
from test_moe_vs_transformers import CASES as MOE_CASES, make_tiny_moe
from tiny_llama import make_tiny_llama
from tiny_models import make_tiny_model

pytestmark = pytest.mark.usefixtures("ops_enabled")


def step_logits(llm: LLM, prompts: list[list[int]], history: int) -> np.ndarray:
    """Logits of every token of `prompts`, each after its own `history` tokens prefilled into the cache."""
    engine = llm.llm_engine
    block_size = engine.config.cache_config.block_size
    tables = [engine.block_pool.allocate(-(-(history + len(p)) // block_size)) for p in prompts]
    rng = np.random.default_rng(history)
    past = [rng.integers(10, 500, size=history).tolist() for _ in prompts]
    try:
        if history:
            forward_logits(llm, past, tables, history=0)
        return forward_logits(llm, prompts, tables, history)
    finally:
        for t in tables:
            engine.block_pool.free(t)


def fused_and_layerwise(llm: LLM, prompts: list[list[int]], history: int) -> tuple[np.ndarray, np.ndarray]:
    decoder = model_runner(llm).model.model
    runs = decoder.runs
    assert len(runs) == 1 and isinstance(runs[0], FusedDecoderLayers), "every layer of these models is fused"
    fused = step_logits(llm, prompts, history)
    decoder.runs = list(decoder.layers)
    try:
        layerwise = step_logits(llm, prompts, history)
    finally:
        decoder.runs = runs
    return fused, layerwise


@pytest.mark.parametrize("lengths,history", [([1, 1, 1], 70), ([5, 17], 0), ([3], 64)])
def test_tiny_dense_llama_fused_equals_layerwise(tmp_path, lengths, history):
    make_tiny_llama(tmp_path)
    llm = LLM(model=str(tmp_path), max_model_len=256, num_gpu_blocks_override=32)
    rng = np.random.default_rng(len(lengths) + history)
    prompts = [rng.integers(3, 500, size=n).tolist() for n in lengths]
    fused, layerwise = fused_and_layerwise(llm, prompts, history)
    np.testing.assert_array_equal(fused, layerwise)


@pytest.fixture(scope="module")
def gguf_llm(smollm_path):
    """The default model built with the compiled ops (the shared fixture may predate ops_enabled)."""
    from fastdeploy.model_executor.ops import fallbacks_forced

    with fallbacks_forced(False):
        return LLM(model=smollm_path, max_model_len=256, max_num_seqs=32, num_gpu_blocks_override=64)


@pytest.mark.parametrize("lengths", [[1], [1] * 20, [9, 4]])  # block kernels (1, 9 rows), the wide one (20)
def test_default_gguf_model_fused_equals_layerwise(gguf_llm, lengths):
    qkv_proj = model_runner(gguf_llm).model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv_proj.method, GGUFLinearMethod)  # GGUF blocks
    rng = np.random.default_rng(len(lengths))
    prompts = [rng.integers(10, 40000, size=n).tolist() for n in lengths]
    fused, layerwise = fused_and_layerwise(gguf_llm, prompts, history=30)
    np.testing.assert_array_equal(fused, layerwise)


def test_consecutive_runs_group_equal_flags():
    flags = [True, True, False, True, False, False]
    assert consecutive_runs(flags) == [(0, 2, True), (2, 3, False), (3, 4, True), (4, 6, False)]
    assert consecutive_runs([]) == []


# ---- Qwen2 (q/k/v biases), Qwen3 (q/k norms), ERNIE-4.5 use_bias (all biases), each weight format ----
ZOO = ["qwen2", "qwen3", "ernie45_bias"]
GGUF_TYPES = {"gguf_q8_0": 8, "gguf_q4_0": 2}
FORMATS = ["float32", "bfloat16", "wint8", "wint4", *GGUF_TYPES]


@pytest.fixture(scope="module")
def zoo_paths(tmp_path_factory):
    paths = {}
    for name in ZOO:
        paths[name] = tmp_path_factory.mktemp(name)
        make_tiny_model(paths[name], name, seed=3)
    return paths


def requantize_to_gguf(llm: LLM, qtype: int) -> None:
    """Every decoder-layer Linear of the (float32) model re-made as GGUF blocks of `qtype` quantized
    from its weights by gguf-py, then the plan of runs rebuilt: the GGUF zoo without GGUF files."""
    import gguf

    decoder = model_runner(llm).model.model
    linear_op, interleave_op = compiled_op("gguf_linear"), compiled_op("gguf_interleave_rows")
    for layer in decoder.layers:
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            dense = np.ascontiguousarray(linear.weight.numpy().T)  # [out, in]
            blocks = gguf.quants.quantize(dense, gguf.GGMLQuantizationType(qtype))
            linear.method = GGUFLinearMethod(qtype, linear_op, interleave_op)
            linear.weight = linear.method.create_weights(linear)
            linear.weight_loader(linear.weight, QuantizedTensor(blocks, qtype, linear.in_features))
    decoder.runs = plan_layer_runs(decoder.layers, decoder.attn_backend)


def zoo_llm(path, weight_format: str) -> LLM:
    kwargs = dict(max_model_len=256, num_gpu_blocks_override=32)
    if weight_format in ("wint8", "wint4"):
        kwargs["quantization"] = weight_format
    elif weight_format == "bfloat16":
        kwargs["dtype"] = "bfloat16"
    else:
        kwargs["dtype"] = "float32"
    llm = LLM(model=str(path), **kwargs)
    if weight_format in GGUF_TYPES:
        requantize_to_gguf(llm, GGUF_TYPES[weight_format])
    return llm


def assert_weight_format(llm: LLM, weight_format: str) -> None:
    """Every decoder linear is computed in the format under test (not a dense fallback)."""
    for layer in model_runner(llm).model.model.layers:
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            _, qtype = linear.method.operand(linear, 1)
            expected = GGUF_TYPES.get(weight_format, KIND_IDS.get(weight_format, 0))
            assert qtype == expected, (weight_format, type(linear.method).__name__, qtype)


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("name", ZOO)
def test_zoo_fused_equals_layerwise(zoo_paths, name, weight_format):
    llm = zoo_llm(zoo_paths[name], weight_format)
    assert_weight_format(llm, weight_format)
    layer = model_runner(llm).model.model.layers[0]
    attn = layer.self_attn
    assert (attn.qkv_proj.bias is not None, attn.q_norm is not None, layer.mlp.down_proj.bias is not None) == {
        "qwen2": (True, False, False), "qwen3": (False, True, False), "ernie45_bias": (True, False, True)}[name]
    rng = np.random.default_rng(7)
    for lengths, history in (([1, 1, 1], 40), ([5, 17], 0), ([70], 3)):  # decode, prefill, a wide prefill
        prompts = [rng.integers(3, 500, size=n).tolist() for n in lengths]
        fused, layerwise = fused_and_layerwise(llm, prompts, history)
        assert np.isfinite(fused).all()
        np.testing.assert_array_equal(fused, layerwise, err_msg=f"{name} {weight_format} {lengths} {history}")


def test_qk_norm_op_equals_the_per_head_rms_norm_of_float64_numpy():
    """fd_qk_rms_norm (both paths' q/k norm) against float64 numpy: q and k heads normalised, v untouched."""
    import paddle

    rng = np.random.default_rng(0)
    heads, kv_heads, dim, eps = 4, 2, 32, 1e-6
    qkv = rng.standard_normal((5, (heads + 2 * kv_heads) * dim)).astype(np.float32)
    q_w, k_w = (1 + 0.2 * rng.standard_normal(dim)).astype(np.float32), rng.standard_normal(dim).astype(np.float32)
    tensor = paddle.to_tensor(qkv)
    compiled_op("fd_qk_rms_norm")(tensor, paddle.to_tensor(q_w), paddle.to_tensor(k_w), heads, kv_heads, eps)
    x = qkv.astype(np.float64).reshape(5, heads + 2 * kv_heads, dim)
    ref = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    ref[:, :heads] *= q_w
    ref[:, heads : heads + kv_heads] *= k_w
    ref[:, heads + kv_heads :] = x[:, heads + kv_heads :]
    out = tensor.numpy().reshape(ref.shape)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[:, heads + kv_heads :], qkv.reshape(ref.shape)[:, heads + kv_heads :])


@pytest.mark.parametrize("name", ZOO)
def test_plan_fuses_every_layer_of_the_dense_zoo(zoo_paths, name):
    decoder = model_runner(zoo_llm(zoo_paths[name], "float32")).model.model
    assert all(layer.fusable for layer in decoder.layers)
    assert len(decoder.runs) == 1 and isinstance(decoder.runs[0], FusedDecoderLayers)
    assert decoder.runs[0].caches == slice(0, len(decoder.layers))


MOE_FUSED_CASES = ["ernie_moe_use_bias", "qwen3_moe_sparse_step2", "qwen3_moe_no_norm"]


@pytest.mark.parametrize("case", MOE_FUSED_CASES)
def test_plan_fuses_every_layer_of_moe_models(tmp_path, case):
    """Dense and MoE layers alike, in one run (ERNIE-MoE: shared experts and biases; Qwen3-MoE with a
    dense layer between MoE layers; without top-k renormalisation)."""
    family, overrides, sparse = MOE_CASES[case]
    make_tiny_moe(tmp_path, family, **overrides)
    decoder = model_runner(LLM(model=str(tmp_path), max_model_len=256, num_gpu_blocks_override=32)).model.model
    kinds = [type(layer.mlp) for layer in decoder.layers]
    assert kinds == [SparseMoE if i in sparse else DenseMLP for i in range(len(kinds))]
    assert len(decoder.runs) == 1 and isinstance(decoder.runs[0], FusedDecoderLayers)
    assert decoder.runs[0].caches == slice(0, len(decoder.layers))


@pytest.mark.parametrize("weight_format", ["float32", "bfloat16", "wint8", "wint4"])
@pytest.mark.parametrize("case", MOE_FUSED_CASES)
def test_moe_models_fused_equal_layerwise(tmp_path, case, weight_format):
    """The fused op's MoE layers (experts in flat lists across layers, shared experts as the layer's MLP
    weights) against SparseMoE.forward layer by layer, bit for bit, decode and prefill."""
    family, overrides, sparse = MOE_CASES[case]
    make_tiny_moe(tmp_path, family, **overrides)
    llm = zoo_llm(tmp_path, weight_format)
    decoder = model_runner(llm).model.model
    expected = KIND_IDS.get(weight_format, 0)
    experts = [e for i in sparse for e in decoder.layers[i].mlp.experts]
    assert all(linear.method.operand(linear, 1)[1] == expected
               for e in experts for linear in (e.gate_up_proj, e.down_proj)), weight_format
    rng = np.random.default_rng(11)
    for lengths, history in (([1, 1, 1, 1], 30), ([6, 19], 0), ([40], 5)):
        prompts = [rng.integers(3, 500, size=n).tolist() for n in lengths]
        fused, layerwise = fused_and_layerwise(llm, prompts, history)
        assert np.isfinite(fused).all()
        np.testing.assert_array_equal(fused, layerwise, err_msg=f"{case} {weight_format} {lengths} {history}")
