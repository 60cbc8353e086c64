"""`append_attention` (custom_ops/cpu_ops/append_attention.cc) against a float64 numpy reference and
the pure-Paddle backend path, on random ragged steps.

Steps mix decodes and prefills with and without history; sequence lengths end inside, at and just
past block boundaries; GQA ratios 1, 3 and 8; head dims 64 and 128; block tables shuffled; long
prompts span several query tiles (and the Paddle path's long-prefill blocks). Both paths also
write this step's K/V: the caches must equal the reference's, slot for slot, everywhere.
Tolerance: 1e-5 absolute on attention outputs (float32 sums in other orders, exp with -ffast-math);
cache contents are copies, compared exactly.

bf16 caches: the same steps with the history held in bf16; the reference attends over the bf16 values
(widened exactly) and this step's K/V rounded to the nearest bf16, ties to even (`round_bf16`: numpy's
own round-half-to-even on the 8-bit significand, independent of the engine's bit arithmetic). The
caches after the write must hold exactly those roundings; the outputs get float32's tolerance, since
widening is exact and the arithmetic is float32 on both. (The op's AMX decode kernel multiplies bf16
pairs: it splits each float32 operand into three bf16 parts, whose products are exact in float32, so it
is held to the same tolerance; `kernel=1` runs the FMA kernels on the same steps.)
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


def round_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 value as float32, ties to even (finite normal inputs): the
    significand in [0.5, 1) scaled to 8 bits, rounded half to even by np.round, scaled back."""
    mantissa, exponent = np.frexp(np.asarray(a, np.float64))
    return np.ldexp(np.round(mantissa * 256), exponent - 8).astype(np.float32)


def bf16_bits_of(values: np.ndarray) -> np.ndarray:
    """float32 values that are bf16 already -> their uint16 bit patterns (the upper halves)."""
    return (np.ascontiguousarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def cache_values(array: np.ndarray) -> np.ndarray:
    """A cache array as float32: uint16 bf16 bits widened (shifted up 16), float32 as it is."""
    if array.dtype == np.float32:
        return array
    return (array.astype(np.uint32) << 16).view(np.float32)


def make_step(rng, heads, kv_heads, head_dim, lengths, dtype="float32", block_size=BLOCK_SIZE):
    """(cache of `dtype` filled with random history, ForwardMeta, qkv [n, (heads + 2 kv_heads) * head_dim])."""
    lengths = [lengths[i] for i in rng.permutation(len(lengths))]
    needed = [-(-(h + n) // block_size) for h, n in lengths]
    num_blocks = sum(needed) + 4
    cache = allocate_kv_cache(num_blocks, kv_heads, block_size, head_dim, dtype)
    for array in (cache.key, cache.value):
        history = rng.standard_normal(array.shape, dtype=np.float32)
        array[...] = history if dtype == "float32" else bf16_bits_of(round_bf16(history))
    free = list(rng.permutation(np.arange(1, num_blocks)))
    tables = [[int(free.pop()) for _ in range(k)] for k in needed]
    positions = np.concatenate([np.arange(h, h + n) for h, n in lengths])
    meta = ForwardMeta.build(seq_lens_this_time=[n for _, n in lengths], seq_lens_decoder=[h for h, _ in lengths],
                             block_tables=tables, block_size=block_size, caches=[cache])
    qkv = rng.standard_normal((len(positions), (heads + 2 * kv_heads) * head_dim), dtype=np.float32)
    return cache, meta, qkv


def copy_cache(cache: KVCache) -> KVCache:
    blocks, kv_heads, block_size, head_dim = cache.key_tensor.shape
    fresh = allocate_kv_cache(blocks, kv_heads, block_size, head_dim, cache.dtype)
    fresh.key[...], fresh.value[...] = cache.key, cache.value
    return fresh


def reference(cache: KVCache, meta: ForwardMeta, qkv: np.ndarray, heads: int, scale: float):
    """(output [n, heads * head_dim], key cache, value cache) in float64 numpy, caches [blocks, kvh, bs, dim];
    a bf16 cache holds this step's K/V rounded to bf16, and is attended over as such."""
    blocks, kv_heads, block_size, dim = cache.key_tensor.shape
    key = cache_values(cache.key).reshape(blocks, kv_heads, block_size, dim).astype(np.float64)
    value = cache_values(cache.value).reshape(blocks, kv_heads, block_size, dim).astype(np.float64)
    n = qkv.shape[0]
    stored = round_bf16 if cache.dtype == "bfloat16" else np.asarray
    q = qkv[:, : heads * dim].reshape(n, heads, dim).astype(np.float64)
    k = stored(qkv[:, heads * dim : (heads + kv_heads) * dim].reshape(n, kv_heads, dim))
    v = stored(qkv[:, (heads + kv_heads) * dim :].reshape(n, kv_heads, dim))
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
    assert np.array_equal(cache_values(cache.key).reshape(key.shape), key.astype(np.float32))
    assert np.array_equal(cache_values(cache.value).reshape(value.shape), value.astype(np.float32))


def assert_both_backends_match(cache, meta, qkv, heads, kv_heads, head_dim, block_size):
    """The compiled backend and the Paddle one, each on its own copy of the cache, against the reference
    (the model's route: metadata once per step, then forward per layer)."""
    expected = reference(cache, meta, qkv, heads, head_dim**-0.5)
    for forced in (False, True):
        with fallbacks_forced(forced):
            backend = select_attention_backend(heads, kv_heads, head_dim, block_size)
            assert isinstance(backend, PaddleAttentionBackend if forced else AppendAttentionBackend)
            run_cache = copy_cache(cache)
            got = backend.forward(paddle.to_tensor(qkv), run_cache, backend.init_attention_metadata(meta))
            assert_matches(got, run_cache, expected)


def test_round_bf16_oracle_on_known_values():
    """The oracle itself: ties go to the even neighbour, other values to the nearer one."""
    one_ulp = 2.0**-7  # of bf16 at 1.0
    x = np.array([1 + one_ulp / 2, 1 + 1.5 * one_ulp, 1 + one_ulp / 2 + 2**-20, -(1 + one_ulp / 2), 3.0, 1e-3],
                 np.float32)
    expected = np.array([1, 1 + 2 * one_ulp, 1 + one_ulp, -1, 3, 0.0009994507], np.float32)
    np.testing.assert_array_equal(round_bf16(x), expected)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (9, 3), (16, 2)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_op_and_paddle_path_match_reference(heads, kv_heads, head_dim, dtype):
    assert compiled_op("append_attention") is not None, "the compiled custom ops failed to build (see the log)"
    rng = np.random.default_rng(heads * head_dim)
    cache, meta, qkv = make_step(rng, heads, kv_heads, head_dim, STEP, dtype)
    assert_both_backends_match(cache, meta, qkv, heads, kv_heads, head_dim, BLOCK_SIZE)


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


@pytest.mark.parametrize("kernel", [0, 1])
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", [(16, 2, 128, 64), (9, 3, 64, 16), (4, 1, 32, 20),
                                                                (34, 2, 64, 16), (4, 4, 48, 4)])
def test_both_decode_kernels_match_reference(kernel, heads, kv_heads, head_dim, block_size):
    """The op's decode kernels over a bf16 cache (0: AMX tiles where Linux grants them, else as 1: the FMA
    kernels) on decodes of odd and even lengths that end inside, at and past block boundaries, beside
    prefills: ERNIE-4.5-0.3B's GQA (16 / 2 x 128), a block size no multiple of 16, 17 query heads per KV
    head (over a tile's 16: the FMA kernels) and head_dim 48 (no multiple of 32: the FMA kernels)."""
    rng = np.random.default_rng(kernel * 100 + heads + block_size)
    steps = [(h, 1) for h in (0, 1, 2, 14, 15, 16, 31, 62, 63, 64, 65, 126, 200)] + [(0, 7), (30, 9)]
    cache, meta, qkv = make_step(rng, heads, kv_heads, head_dim, steps, "bfloat16", block_size)
    expected = reference(cache, meta, qkv, heads, head_dim**-0.5)
    index = [paddle.to_tensor(a) for a in (meta.slot_mapping, meta.cu_seqlens_q, meta.seq_lens_decoder,
                                            meta.block_tables)]
    got = append_attention(paddle.to_tensor(qkv), cache.key_tensor, cache.value_tensor, *index, heads,
                           head_dim**-0.5, kernel)
    assert_matches(got, cache, expected)


def test_op_rejects_an_unknown_kernel():
    rng = np.random.default_rng(23)
    cache, meta, qkv = make_step(rng, 4, 2, 64, [(20, 1)], "bfloat16")
    args = [paddle.to_tensor(a) for a in (meta.slot_mapping, meta.cu_seqlens_q, meta.seq_lens_decoder,
                                          meta.block_tables)]
    with pytest.raises(OSError, match="kernel must be 0"):
        compiled_op("append_attention")(paddle.to_tensor(qkv), cache.key_tensor, cache.value_tensor, *args, 4, 0.125, 2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block_size", [4, 20])
def test_block_sizes_not_a_multiple_of_16(block_size, dtype):
    """The decode item scores a block's last block_size % 16 keys one at a time (its tail path)."""
    heads, kv_heads, head_dim = 8, 2, 64
    rng = np.random.default_rng(block_size)
    steps = [(h, 1) for h in (0, 3, 18, 19, 20, 21, 57)] + [(0, 9), (13, 30)]
    cache, meta, qkv = make_step(rng, heads, kv_heads, head_dim, steps, dtype, block_size)
    assert_both_backends_match(cache, meta, qkv, heads, kv_heads, head_dim, block_size)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_decode_batch_runs_threaded_and_matches(dtype):
    """Enough work for the op's OpenMP threads: 48 decodes of 100-300 positions, 16 heads."""
    heads, kv_heads, head_dim = 16, 2, 128
    rng = np.random.default_rng(3)
    steps = [(int(h), 1) for h in rng.integers(100, 300, 48)]
    cache, meta, qkv = make_step(rng, heads, kv_heads, head_dim, steps, dtype)
    expected = reference(cache, meta, qkv, heads, head_dim**-0.5)
    backend = select_attention_backend(heads, kv_heads, head_dim, BLOCK_SIZE)
    assert isinstance(backend, AppendAttentionBackend)
    attn_meta = backend.init_attention_metadata(meta)
    got = backend.forward(paddle.to_tensor(qkv), cache, attn_meta)
    assert_matches(got, cache, expected)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_head_dims_the_op_does_not_take_use_the_paddle_path(dtype):
    heads, kv_heads, head_dim = 4, 2, 40  # not a multiple of 16
    rng = np.random.default_rng(5)
    cache, meta, qkv = make_step(rng, heads, kv_heads, head_dim, STEP[:9], dtype)
    expected = reference(cache, meta, qkv, heads, head_dim**-0.5)
    backend = select_attention_backend(heads, kv_heads, head_dim, BLOCK_SIZE)
    assert isinstance(backend, PaddleAttentionBackend)
    got = backend.forward(paddle.to_tensor(qkv), cache, backend.init_attention_metadata(meta))
    assert_matches(got, cache, expected)


@pytest.mark.parametrize("forced", [False, True])
def test_shim_takes_paddle_bfloat16_caches(forced):
    """Paddle bfloat16 tensors (not uint16 bits) are bf16 caches too, for the op and the Paddle path."""
    heads, kv_heads, head_dim = 6, 2, 64
    rng = np.random.default_rng(17)
    cache, meta, qkv = make_step(rng, heads, kv_heads, head_dim, STEP[:10], "bfloat16")
    expected = reference(cache, meta, qkv, heads, 0.125)
    shape = cache.key_tensor.shape
    key, value = (paddle.to_tensor(cache_values(a).reshape(shape)).cast("bfloat16") for a in (cache.key, cache.value))
    index = [paddle.to_tensor(a) for a in (meta.slot_mapping, meta.cu_seqlens_q, meta.seq_lens_decoder,
                                            meta.block_tables)]
    with fallbacks_forced(forced):
        got = append_attention(paddle.to_tensor(qkv), key, value, *index, heads, 0.125)
    written = KVCache.of(key, value)
    assert written.dtype == "bfloat16" and key.dtype == paddle.bfloat16
    assert_matches(got, written, expected)


@pytest.mark.parametrize("key_dtype,value_dtype", [("float32", "bfloat16"), ("float16", "float16")])
def test_op_rejects_caches_of_other_dtypes_naming_the_allowed_ones(key_dtype, value_dtype):
    rng = np.random.default_rng(19)
    cache, meta, qkv = make_step(rng, 4, 2, 64, [(20, 1), (0, 5)])
    key, value = cache.key_tensor.cast(key_dtype), cache.value_tensor.cast(value_dtype)
    args = [paddle.to_tensor(a) for a in (meta.slot_mapping, meta.cu_seqlens_q, meta.seq_lens_decoder,
                                          meta.block_tables)]
    with pytest.raises(OSError, match="both be float32, or both bf16"):
        compiled_op("append_attention")(paddle.to_tensor(qkv), key, value, *args, 4, 0.125, 0)
    with pytest.raises(ValueError, match="both be float32 or both bf16"):
        KVCache.of(key, value)


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
        op(paddle.to_tensor(qkv), cache.key_tensor, cache.value_tensor, *args, 4, 0.125, 0)


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
