"""A GGUF model's token embedding held in the file's blocks (layers/embeddings.py), its rows looked up
exactly.

Oracle: gguf-py's `dequantize` of the file's `token_embd.weight` (read by gguf-py's GGUFReader), row by
row, bit for bit. Files: tiny random Llama (untied: output.weight apart) and Qwen3 (tied: no
output.weight) GGUFs of tests/model_executor/gguf_checkpoints.py, each layout of blocks (Q8_0 / Q4_1
interleaved, Q4_K / Q6_K row-major) and F16 (held in float32).
"""
import gguf
import numpy as np
import paddle
import pytest

from fastdeploy import LLM
from fastdeploy.model_executor.layers.embeddings import GGUFEmbedding, TiedEmbedding, VocabEmbedding
from fastdeploy.model_executor.layers.quantization.gguf import GGUFConfig
from fastdeploy.model_executor.model_loader.quantized import QuantizedTensor
from fastdeploy.model_executor.ops import compiled_op, fallbacks_forced

from gguf_checkpoints import Q, write_gguf
from runner_access import model_runner
from tiny_llama import VOCAB_SIZE

# (architecture, type of every matrix) -> the embedding layer the model holds
CASES = {("llama", Q.Q4_K): GGUFEmbedding, ("llama", Q.Q8_0): GGUFEmbedding, ("llama", Q.F16): VocabEmbedding,
         ("qwen3", Q.Q6_K): TiedEmbedding, ("qwen3", Q.Q4_1): TiedEmbedding}


def reference_rows(path) -> np.ndarray:
    """gguf-py's dequantized token_embd.weight [vocab, hidden] float32."""
    tensor, = (t for t in gguf.GGUFReader(str(path)).tensors if t.name == "token_embd.weight")
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)


def shuffled_ids() -> np.ndarray:
    """Every id once, shuffled, then a few repeated (the first and last rows included)."""
    rng = np.random.default_rng(0)
    return np.concatenate([rng.permutation(VOCAB_SIZE), [0, VOCAB_SIZE - 1, 7, 7]]).astype(np.int64)


def float32_tables(model) -> list[str]:
    """Names of the model's float32 embedding and lm_head parameters."""
    return [n for n, p in model.named_parameters()
            if p.dtype == paddle.float32 and n.startswith(("model.embed_tokens.", "lm_head."))]


@pytest.mark.skipif(compiled_op("gguf_embedding") is None, reason="needs the compiled custom ops")
@pytest.mark.parametrize("arch, qtype", list(CASES), ids=[f"{a}-{t.name}" for a, t in CASES])
def test_looked_up_rows_are_gguf_py_dequantized_rows(tmp_path, arch, qtype):
    """embed_input_ids of every id equals gguf-py's row; a block type is held in its blocks (tied: once,
    no embedding parameter; no float32 embedding or lm_head), F16 as a float32 VocabEmbedding."""
    path, _ = write_gguf(tmp_path, arch, qtype)
    llm = LLM(model=str(path), max_model_len=64, num_gpu_blocks_override=4)  # alive: it owns the weights
    model = model_runner(llm).model
    expected = reference_rows(path)
    ids = shuffled_ids()
    with paddle.no_grad():
        rows = model.embed_input_ids(paddle.to_tensor(ids)).numpy()
    np.testing.assert_array_equal(rows, expected[ids])
    assert type(model.model.embed_tokens) is CASES[(arch, qtype)]
    tables = float32_tables(model)
    assert tables == (["model.embed_tokens.weight", "lm_head.weight"] if qtype == Q.F16 else []), tables


def test_without_the_compiled_ops_the_embedding_is_float32(tmp_path):
    """Ops not built (fallbacks forced): a tied Q4_K file's embedding is a float32 VocabEmbedding holding
    gguf-py's values, lm_head a float32 copy beside it."""
    path, _ = write_gguf(tmp_path, "qwen3", Q.Q4_K)
    with fallbacks_forced():
        llm = LLM(model=str(path), max_model_len=64, num_gpu_blocks_override=4)
        model = model_runner(llm).model
        ids = shuffled_ids()
        with paddle.no_grad():
            rows = model.embed_input_ids(paddle.to_tensor(ids)).numpy()
    expected = reference_rows(path)
    np.testing.assert_array_equal(rows, expected[ids])
    assert isinstance(model.model.embed_tokens, VocabEmbedding)
    assert float32_tables(model) == ["model.embed_tokens.weight", "lm_head.weight"]


@pytest.mark.skipif(compiled_op("gguf_embedding") is None, reason="needs the compiled custom ops")
def test_loading_another_type_or_shape_is_refused():
    """A GGUFEmbedding built for the header's Q4_K refuses Q6_K blocks and a wrong shape, naming both."""
    embedding = GGUFConfig({"model.embed_tokens.weight": int(Q.Q4_K)}).linear_method(["model.embed_tokens.weight"])
    layer = GGUFEmbedding(8, 256, embedding)
    q6k = QuantizedTensor(np.zeros((8, 210), np.uint8), int(Q.Q6_K), 256)
    with pytest.raises(ValueError, match="GGUF type 14, but the file's header announced type 12"):
        layer.weight_loader(layer.weight, q6k)
    with pytest.raises(ValueError, match=r"has shape \[4, 256\], expected \[8, 256\]"):
        layer.weight_loader(layer.weight, QuantizedTensor(np.zeros((4, 144), np.uint8), int(Q.Q4_K), 256))
