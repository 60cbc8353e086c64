"""`append_attention` (custom_ops/cpu_ops/append_attention.cc) against a float64 numpy reference and
the pure-Paddle backend path, on random ragged steps.

Steps mix decodes and prefills with and without history; sequence lengths end inside, at and just
past block boundaries; GQA ratios 1, 3 and 8; head dims 64 and 128; block tables shuffled; long
prompts span several query tiles (and the Paddle path's long-prefill blocks). Both paths also
write this step's K/V: the caches must equal the reference's, slot for slot, everywhere.
Tolerance: 1e-5 absolute on attention outputs (float32 sums in other orders, exp with -ffast-math);
cache contents are copies, compared exactly.
"""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.append_attention import AppendAttentionBackend, select_attention_backend
from fastdeploy.model_executor.layers.attention import KVCache, PaddleAttentionBackend, allocate_kv_cache
from fastdeploy.model_executor.ops import compiled_op, fallbacks_forced
from fastdeploy.model_executor.ops.attention import append_attention

pytestmark = pytest.mark.usefixtures("ops_enabled")  # op tests run the compiled op even when fallbacks are forced

BLOCK_SIZE = 16
TOLERANCE = 1e-5
# (history, new tokens) per request: decodes at/around block boundaries, prefills with and without
# history, a 300-token prompt (several op tiles, the Paddle path's long-prefill route)
STEP = [(0, 1), (14, 1), (15, 1), (16, 1), (47, 1), (0, 16), (0, 17), (5, 11), (31, 2), (16, 40), (3, 300), (100, 7)]


def make_step(rng, heads, kv_heads, head_dim, lengths):
    """(cache filled with random history, ForwardMeta, qkv [n, (heads + 2 kv_heads) * head_dim])."""
    lengths = [lengths[i] for i in rng.permutation(len(lengths))]
    needed = [-(-(h + n) // BLOCK_SIZE) for h, n in lengths]
    num_blocks = sum(needed) + 4
    cache = allocate_kv_cache(num_blocks, kv_heads, BLOCK_SIZE, head_dim)
    cache.key[...] = rng.standard_normal(cache.key.shape, dtype=np.float32)
    cache.value[...] = rng.standard_normal(cache.value.shape, dtype=np.float32)
    free = list(rng.permutation(np.arange(1, num_blocks)))
    tables = [[int(free.pop()) for _ in range(k)] for k in needed]
    positions = np.concatenate([np.arange(h, h + n) for h, n in lengths])
    meta = ForwardMeta.build(seq_lens_this_time=[n for _, n in lengths], seq_lens_decoder=[h for h, _ in lengths],
                             block_tables=tables, block_size=BLOCK_SIZE, caches=[cache])
    qkv = rng.standard_normal((len(positions), (heads + 2 * kv_heads) * head_dim), dtype=np.float32)
    return cache, meta, qkv


def copy_cache(cache: KVCache) -> KVCache:
    blocks, kv_heads, block_size, head_dim = cache.key_tensor.shape
    fresh = allocate_kv_cache(blocks, kv_heads, block_size, head_dim)
    fresh.key[...], fresh.value[...] = cache.key, cache.value
    return fresh


def reference(cache: KVCache, meta: ForwardMeta, qkv: np.ndarray, heads: int, scale: float):
    """(output [n, heads * head_dim], key cache, value cache) in float64 numpy, caches [blocks, kvh, bs, dim]."""
    blocks, kv_heads, block_size, dim = cache.key_tensor.shape
    key = cache.key.reshape(blocks, kv_heads, block_size, dim).astype(np.float64)
    value = cache.value.reshape(blocks, kv_heads, block_size, dim).astype(np.float64)
    n = qkv.shape[0]
    q = qkv[:, : heads * dim].reshape(n, heads, dim).astype(np.float64)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].reshape(n, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].reshape(n, kv_heads, dim)
    key[meta.slot_mapping // block_size, :, meta.slot_mapping % block_size] = k
    value[meta.slot_mapping // block_size, :, meta.slot_mapping % block_size] = v
    out = np.zeros((n, heads, dim))
    for i, history in enumerate(meta.seq_lens_decoder):
        start, end = meta.cu_seqlens_q[i], meta.cu_seqlens_q[i + 1]
        table = meta.block_tables[i, : -(-(history + end - start) // block_size)]
        keys = key[table].transpose(1, 0, 2, 3).reshape(kv_heads, -1, dim)  # [kvh, positions, dim]
        values = value[table].transpose(1, 0, 2, 3).reshape(kv_heads, -1, dim)
        for j in range(start, end):
            visible = history + j - start + 1
            for h in range(heads):
                kv = h // (heads // kv_heads)
                s = keys[kv, :visible] @ q[j, h] * scale
                p = np.exp(s - s.max())
                out[j, h] = p / p.sum() @ values[kv, :visible]
    return out.reshape(n, -1), key, value


def assert_matches(got: paddle.Tensor, cache: KVCache, expected):
    out, key, value = expected
    assert np.abs(got.numpy() - out).max() < TOLERANCE
    assert np.array_equal(cache.key.reshape(key.shape), key.astype(np.float32))
    assert np.array_equal(cache.value.reshape(value.shape), value.astype(np.float32))


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (16, 2)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_op_and_paddle_path_match_reference(heads, kv_heads, head_dim):
    assert compiled_op("append_attention") is not None, "the compiled custom ops failed to build (see the log)"
    rng = np.random.default_rng(heads * head_dim)
    cache, meta, qkv = make_step(rng, heads, kv_heads, head_dim, STEP)
    expected = reference(cache, meta, qkv, heads, head_dim**-0.5)
    for forced in (False, True):  # the model's route: metadata once per step, then forward per layer
        with fallbacks_forced(forced):
            backend = select_attention_backend(heads, kv_heads, head_dim, BLOCK_SIZE)
            assert isinstance(backend, PaddleAttentionBackend if forced else AppendAttentionBackend)
            run_cache = copy_cache(cache)
            got = backend.forward(paddle.to_tensor(qkv), run_cache, backend.init_attention_metadata(meta))
            assert_matches(got, run_cache, expected)


@pytest.mark.parametrize("forced", [False, True])
def test_shim_matches_reference_with_a_custom_scale(forced):
    heads, kv_heads, head_dim, scale = 8, 1, 64, 0.3
    rng = np.random.default_rng(7)
    cache, meta, qkv = make_step(rng, heads, kv_heads, head_dim, STEP[:10])
    expected = reference(cache, meta, qkv, heads, scale)
    index = [paddle.to_tensor(a) for a in (meta.slot_mapping, meta.cu_seqlens_q, meta.seq_lens_decoder,
                                            meta.block_tables)]
    with fallbacks_forced(forced):
        got = append_attention(paddle.to_tensor(qkv), cache.key_tensor, cache.value_tensor, *index, heads, scale)
    assert_matches(got, cache, expected)


def test_large_decode_batch_runs_threaded_and_matches():
    """Enough work for the op's OpenMP threads: 48 decodes of 100-300 positions, 16 heads."""
    heads, kv_heads, head_dim = 16, 2, 128
    rng = np.random.default_rng(3)
    steps = [(int(h), 1) for h in rng.integers(100, 300, 48)]
    cache, meta, qkv = make_step(rng, heads, kv_heads, head_dim, steps)
    expected = reference(cache, meta, qkv, heads, head_dim**-0.5)
    backend = select_attention_backend(heads, kv_heads, head_dim, BLOCK_SIZE)
    assert isinstance(backend, AppendAttentionBackend)
    attn_meta = backend.init_attention_metadata(meta)
    got = backend.forward(paddle.to_tensor(qkv), cache, attn_meta)
    assert_matches(got, cache, expected)


def test_head_dims_the_op_does_not_take_use_the_paddle_path():
    heads, kv_heads, head_dim = 4, 2, 40  # not a multiple of 16
    rng = np.random.default_rng(5)
    cache, meta, qkv = make_step(rng, heads, kv_heads, head_dim, STEP[:9])
    expected = reference(cache, meta, qkv, heads, head_dim**-0.5)
    backend = select_attention_backend(heads, kv_heads, head_dim, BLOCK_SIZE)
    assert isinstance(backend, PaddleAttentionBackend)
    got = backend.forward(paddle.to_tensor(qkv), cache, backend.init_attention_metadata(meta))
    assert_matches(got, cache, expected)


@pytest.mark.parametrize("field,value,message", [
    ("block_tables", -1, "block id -1"),
    ("slot_mapping", 10**9, "outside the cache"),
    ("cu_seqlens_q", 99, "cu_seqlens_q"),
])
def test_op_rejects_bad_indices(field, value, message):
    op = compiled_op("append_attention")
    assert op is not None
    rng = np.random.default_rng(11)
    cache, meta, qkv = make_step(rng, 4, 2, 64, [(20, 1), (0, 5)])
    arrays = {"slot_mapping": meta.slot_mapping.copy(), "cu_seqlens_q": meta.cu_seqlens_q.copy(),
              "seq_lens_decoder": meta.seq_lens_decoder.copy(), "block_tables": meta.block_tables.copy()}
    arrays[field].reshape(-1)[-1 if field == "cu_seqlens_q" else 0] = value
    args = [paddle.to_tensor(arrays[k]) for k in ("slot_mapping", "cu_seqlens_q", "seq_lens_decoder", "block_tables")]
    with pytest.raises(OSError, match=message):  # Paddle's type for C++ errors
        op(paddle.to_tensor(qkv), cache.key_tensor, cache.value_tensor, *args, 4, 0.125)


@pytest.mark.parametrize("forced", [False, True])
def test_shim_rejects_a_strided_cache(forced):
    """Paddle hands ops a contiguous copy of a strided tensor: the cache writes would be lost."""
    rng = np.random.default_rng(13)
    cache, meta, qkv = make_step(rng, 4, 1, 64, [(3, 2)])
    wide = paddle.zeros([cache.key_tensor.shape[0], 2, BLOCK_SIZE, 64])
    index = [paddle.to_tensor(a) for a in (meta.slot_mapping, meta.cu_seqlens_q, meta.seq_lens_decoder,
                                            meta.block_tables)]
    with fallbacks_forced(forced), pytest.raises(ValueError, match="contiguous"):
        append_attention(paddle.to_tensor(qkv), wide[:, :1], cache.value_tensor, *index, 4, 0.125)
