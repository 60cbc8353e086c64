"""The compiled paged decode-attention op against a numpy reference and the pure-Paddle backend.

Random ragged batches: context lengths that end inside, at and just past block boundaries, GQA
ratios 1, 3 and 8, head dims 64 and 128, shuffled block tables. Tolerance 1e-5 absolute: the op
sums in a different order (and with -ffast-math) than numpy.
"""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.attention import KVCache, PaddleAttentionBackend, allocate_kv_cache
from fastdeploy.model_executor.ops import compiled_ops

BLOCK_SIZE = 16


def random_case(rng, num_heads, kv_heads, head_dim, context_lens):
    n, blocks_per_seq = len(context_lens), -(-max(context_lens) // BLOCK_SIZE)
    num_blocks = n * blocks_per_seq + 1
    cache = allocate_kv_cache(num_blocks, kv_heads, BLOCK_SIZE, head_dim)
    cache.key[...] = rng.standard_normal(cache.key.shape, dtype=np.float32)
    cache.value[...] = rng.standard_normal(cache.value.shape, dtype=np.float32)
    free = list(rng.permutation(np.arange(1, num_blocks)))
    tables = [[int(free.pop()) for _ in range(-(-length // BLOCK_SIZE))] for length in context_lens]
    q = rng.standard_normal((n, num_heads, head_dim), dtype=np.float32)
    return cache, tables, q


def reference(cache: KVCache, tables, q, context_lens, kv_heads, scale):
    n, num_heads, head_dim = q.shape
    key = cache.key.reshape(-1, kv_heads, BLOCK_SIZE, head_dim)
    value = cache.value.reshape(-1, kv_heads, BLOCK_SIZE, head_dim)
    out = np.zeros_like(q)
    for i, (blocks, length) in enumerate(zip(tables, context_lens)):
        k = key[blocks].transpose(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)[:, :length]
        v = value[blocks].transpose(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)[:, :length]
        for h in range(num_heads):
            kv = h // (num_heads // kv_heads)
            s = k[kv] @ q[i, h] * scale
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v[kv]
    return out.reshape(n, -1)


@pytest.mark.parametrize("num_heads,kv_heads", [(4, 4), (9, 3), (16, 2)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_op_and_fallback_match_reference(num_heads, kv_heads, head_dim):
    ops = compiled_ops()
    assert ops is not None, "the compiled CPU ops failed to build on this machine (see the log)"
    rng = np.random.default_rng(num_heads * head_dim)
    context_lens = [1, 15, 16, 17, 32, 33, 100, int(rng.integers(1, 200))]
    cache, tables, q = random_case(rng, num_heads, kv_heads, head_dim, context_lens)
    scale = head_dim**-0.5
    expected = reference(cache, tables, q, context_lens, kv_heads, scale)

    width = max(map(len, tables))
    table = np.array([t + [-1] * (width - len(t)) for t in tables], np.int64)
    got = ops.paged_decode_attention(paddle.to_tensor(q * scale), cache.key_tensor, cache.value_tensor,
                                     paddle.to_tensor(table), paddle.to_tensor(np.array(context_lens)), 1.0)
    assert np.abs(got.numpy() - expected).max() < 1e-5

    # the pure-Paddle path (what runs when the op cannot be built), through the backend's own metadata
    backend = PaddleAttentionBackend(num_heads, kv_heads, head_dim, BLOCK_SIZE)
    backend.decode_op = None
    meta = ForwardMeta.build(
        input_ids=[0] * len(context_lens), positions=np.array(context_lens) - 1,
        seq_lens_this_time=[1] * len(context_lens), seq_lens_decoder=[c - 1 for c in context_lens],
        block_tables=tables, block_size=BLOCK_SIZE, logits_indices=[0],
    )
    attn_meta = backend.init_attention_metadata(meta)
    # write the query tokens' own K/V rows back unchanged, then attend
    rows = cache.key.reshape(-1, head_dim)[attn_meta.write_slots]
    vals = cache.value.reshape(-1, head_dim)[attn_meta.write_slots]
    fallback = backend.forward(paddle.to_tensor(q), paddle.to_tensor(rows), paddle.to_tensor(vals), cache, attn_meta)
    assert np.abs(fallback.numpy() - expected).max() < 1e-5
