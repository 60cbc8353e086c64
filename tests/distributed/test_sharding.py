"""How a checkpoint is cut into tensor-parallel shards (distributed/sharding.py), without processes.

Oracles: the partition properties (every KV head on exactly one rank, query heads following their
GQA group), gguf-py's dequantization of the whole matrix (a GGUF column shard must dequantize to
the same columns), plain numpy slicing for dense tensors, and the wint8 formula (absmax / 127 per
output feature of the whole matrix) for the ranks' packed row-parallel columns.
"""
import numpy as np
import pytest

from fastdeploy.config import ModelConfig
from fastdeploy.distributed.sharding import TensorParallelShard, check_tensor_parallel, kv_head_range
from fastdeploy.model_executor.layers.linear import Linear
from fastdeploy.model_executor.layers.quantization.packed import BF16, WINT4, WINT8, PackedConfig, bf16_values
from fastdeploy.model_executor.model_loader.quantized import Q4_1, Q4_K, Q8_0, QuantizedTensor

SMOLLM = dict(architecture="LlamaForCausalLM", vocab_size=49152, hidden_size=576, intermediate_size=1536,
              num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
              rope_theta=1e5, rope_scaling=None, max_position_embeddings=8192, tie_word_embeddings=True)


def config(**changes) -> ModelConfig:
    return ModelConfig(**{**SMOLLM, **changes})


@pytest.mark.parametrize("kv_heads,size", [(3, 2), (3, 3), (8, 3), (4, 4), (5, 2)])
def test_kv_heads_partition_is_exact_and_balanced(kv_heads, size):
    ranges = [kv_head_range(kv_heads, size, r) for r in range(size)]
    assert ranges[0][0] == 0 and ranges[-1][1] == kv_heads
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, no overlap
    sizes = [end - start for start, end in ranges]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_smollm_on_two_ranks_takes_whole_gqa_groups():
    shards = [TensorParallelShard(config(), r, 2) for r in range(2)]
    local = [s.local_config() for s in shards]
    assert [(c.num_attention_heads, c.num_key_value_heads) for c in local] == [(6, 2), (3, 1)]
    assert [c.intermediate_size for c in local] == [768, 768]
    assert all(c.vocab_size == 49152 for c in local)  # the full vocabulary; the layers take their rows
    assert shards[0].q_rows == (0, 384) and shards[1].q_rows == (384, 576)
    assert shards[0].kv_rows == (0, 128) and shards[1].kv_rows == (128, 192)


@pytest.mark.parametrize("changes,size,words", [
    (dict(), 4, ["tensor_parallel_size=4", "num_key_value_heads=3"]),
    (dict(intermediate_size=1000), 3, ["intermediate_size=1000", "tensor_parallel_size=3"]),
    (dict(hf_config={"moe_intermediate_size": 50}), 3, ["moe_intermediate_size=50"]),
])
def test_unsplittable_models_are_refused_with_the_numbers(changes, size, words):
    with pytest.raises(ValueError) as e:
        check_tensor_parallel(config(**changes), size)
    for word in words:
        assert word in str(e.value)


def test_dense_tensors_are_cut_by_rows_columns_or_kept():
    rng = np.random.default_rng(0)
    shard = TensorParallelShard(config(), 1, 2)
    q = rng.standard_normal((576, 576)).astype(np.float32)
    o = rng.standard_normal((576, 576)).astype(np.float32)
    down = rng.standard_normal((576, 1536)).astype(np.float32)
    np.testing.assert_array_equal(shard.shard("model.layers.0.self_attn.q_proj.weight", q), q[384:576])
    np.testing.assert_array_equal(shard.shard("model.layers.0.self_attn.k_proj.weight", q[:192]), q[128:192])
    np.testing.assert_array_equal(shard.shard("model.layers.0.self_attn.o_proj.weight", o), o[:, 384:576])
    np.testing.assert_array_equal(shard.shard("model.layers.3.mlp.experts.5.up_proj.weight", down.T), down.T[768:])
    np.testing.assert_array_equal(shard.shard("model.layers.3.mlp.down_proj.weight", down), down[:, 768:])
    bias = rng.standard_normal(576).astype(np.float32)
    np.testing.assert_array_equal(shard.shard("model.layers.0.mlp.down_proj.bias", bias), np.zeros(576))
    np.testing.assert_array_equal(TensorParallelShard(config(), 0, 2).shard("model.layers.0.mlp.down_proj.bias",
                                                                            bias), bias)
    router = rng.standard_normal((8, 576)).astype(np.float32)
    assert shard.shard("model.layers.3.mlp.gate.weight", router) is router  # replicated


def test_vocabulary_rows_are_padded_on_the_last_rank():
    shard = TensorParallelShard(config(vocab_size=10, num_key_value_heads=3), 2, 3)
    emb = np.arange(10 * 4, dtype=np.float32).reshape(10, 4)
    part = shard.shard("model.embed_tokens.weight", emb)  # rows 8, 9 and two zero rows
    np.testing.assert_array_equal(part, np.concatenate([emb[8:], np.zeros((2, 4), np.float32)]))


@pytest.mark.parametrize("qtype", [Q4_1, Q8_0])
def test_gguf_column_shard_dequantizes_to_the_same_columns(qtype):
    import gguf

    rng = np.random.default_rng(1)
    dense = rng.standard_normal((8, 128)).astype(np.float32)
    blocks = gguf.quants.quantize(dense, gguf.GGMLQuantizationType(qtype))
    full = QuantizedTensor(blocks, qtype, 128)
    shard = TensorParallelShard(config(intermediate_size=128, num_key_value_heads=3), 1, 2)
    part = shard.shard("model.layers.0.mlp.down_proj.weight", full)
    assert isinstance(part, QuantizedTensor) and part.shape == (8, 64)
    np.testing.assert_array_equal(part.dequantize(), full.dequantize()[:, 64:])
    rows = shard.shard("model.layers.0.mlp.gate_proj.weight", full)
    np.testing.assert_array_equal(rows.dequantize(), full.dequantize()[4:])


def test_gguf_split_inside_a_block_is_refused_before_loading():
    shard = TensorParallelShard(config(intermediate_size=96, num_key_value_heads=3), 0, 2)  # 48 columns
    with pytest.raises(ValueError, match="48 input columns .* not a multiple of the GGUF block"):
        shard.check_quantized_split({"model.layers.0.mlp.down_proj.weight": Q8_0})


def test_k_quant_column_split_is_in_whole_256_weight_blocks():
    """A K-quant block holds 256 weights: a split into 256 columns works, into 128 is refused."""
    blocks = np.random.default_rng(3).integers(0, 256, (8, 2, 144), dtype=np.uint8)  # 2 blocks a row
    blocks[..., 0:4] = np.array([0.01, 0.02], np.float16).view(np.uint8)  # d, dmin: small, finite
    full = QuantizedTensor(blocks.reshape(8, -1), Q4_K, 512)
    shard = TensorParallelShard(config(intermediate_size=512, num_key_value_heads=3), 1, 2)
    shard.check_quantized_split({"model.layers.0.mlp.down_proj.weight": Q4_K})
    part = shard.shard("model.layers.0.mlp.down_proj.weight", full)
    np.testing.assert_array_equal(part.dequantize(), full.dequantize()[:, 256:])
    narrow = TensorParallelShard(config(intermediate_size=256, num_key_value_heads=3), 0, 2)
    with pytest.raises(ValueError, match="128 input columns .* GGUF block \\(256 weights\\)"):
        narrow.check_quantized_split({"model.layers.0.mlp.down_proj.weight": Q4_K})


def test_wint8_ranks_quantize_row_parallel_columns_as_the_whole_matrix():
    import paddle

    rng = np.random.default_rng(2)
    w = rng.standard_normal((8, 128)).astype(np.float32)
    w[:, 3] *= 20  # each row's absmax lies in rank 0's columns: rank 1's own absmax would be far smaller
    s = np.abs(w).max(axis=1) / 127  # the oracle: one process's wint8 of the whole matrix
    dequantized = np.clip(np.rint(w / s[:, None]), -127, 127) * s[:, None]
    x = rng.standard_normal((3, 128)).astype(np.float32)
    total = np.zeros((3, 8), np.float32)
    for rank in range(2):
        name = "model.layers.0.mlp.down_proj.weight"
        part = TensorParallelShard(config(intermediate_size=128), rank, 2).shard(name, w)
        linear = Linear(64, {None: 8}, False, PackedConfig(WINT8).linear_method([name]))
        linear.weight_loader(linear.weight, part)
        total += linear(paddle.to_tensor(x[:, 64 * rank:64 * (rank + 1)])).numpy()  # the all-reduce's sum
    np.testing.assert_allclose(total, bf16_values(x) @ dequantized.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("changes,kind,words", [
    (dict(intermediate_size=96, hf_config={"moe_intermediate_size": 128}), WINT4,
     ["wint4", "model.layers.*.mlp.down_proj", "48 input features", "intermediate_size=96 / 2", "multiple of 32"]),
    (dict(intermediate_size=128, hf_config={"moe_intermediate_size": 48}), WINT4,
     ["model.layers.*.mlp.experts.*.down_proj", "24 input features", "moe_intermediate_size=48 / 2"]),
    (dict(num_attention_heads=6, head_dim=8, intermediate_size=128), WINT4,
     ["rank 1", "model.layers.*.self_attn.o_proj", "16 input features", "2 query heads x head_dim=8"]),
    (dict(intermediate_size=70, hf_config={"moe_intermediate_size": 64}), BF16,
     ["bfloat16", "35 input features", "multiple of 2"]),
])
def test_packed_split_the_format_cannot_take_is_refused_with_the_sizes(changes, kind, words):
    c = config(num_key_value_heads=3, **changes)
    with pytest.raises(ValueError) as e:
        for rank in range(2):
            TensorParallelShard(c, rank, 2).check_packed_split(kind)
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_packed_split_of_smollm_and_even_shards_is_accepted():
    for size in (2, 3):
        for rank in range(size):
            for kind in (BF16, WINT8, WINT4):
                TensorParallelShard(config(), rank, size).check_packed_split(kind)
