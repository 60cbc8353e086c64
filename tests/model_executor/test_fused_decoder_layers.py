"""`fd_decoder_layers` (a run of decoder layers in one compiled op call) against the layer-by-layer path.

Oracle: the same model run layer by layer through the single ops (its plan of runs replaced by the
layers themselves, each through DecoderLayer.forward), which the transformers comparisons in
test_llama_vs_transformers.py and test_default_model_greedy.py check.
The fused op calls the same kernels in the same order, so logits must be bit-identical: on a tiny
dense Llama (weights through Paddle's matmul) and on the default GGUF model (Q4_1 blocks through
gguf_linear; Q8_0 lm_head), for prefills with cached history and for decode steps.
"""
import numpy as np
import pytest

from fastdeploy import LLM
from fastdeploy.model_executor.layers.fused_decoder_layers import FusedDecoderLayers, consecutive_runs
from fastdeploy.model_executor.layers.quantization.gguf import GGUFLinearMethod

from runner_access import forward_logits, model_runner
from tiny_llama import make_tiny_llama

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
