"""Append attention: the cache write bitwise, out against a float64 numpy reference over ragged
batches (GQA ratios, head dims, block sizes, int32 and int64 block tables, float32/float16/bfloat16).
"""
import numpy as np

from harness_common import BF16, DTYPE_NAMES, F16, F32, Table, from_storage, storage_dtype, to_storage
from harness_device import check_call

ATTENTION_TOL = {F32: 1e-4, F16: 4e-3, BF16: 3e-2}


def ragged_requests(rng, block_size: int) -> list:
    """(query tokens, cached tokens) per request: decodes, prefills, a chunked prefill, an empty slot;
    lengths land on and next to block and 32-key tile boundaries."""
    return [
        (1, int(rng.integers(0, 300))),
        (1, block_size - 1),  # the new token opens a block
        (1, 64),  # 32-key tile boundary
        (int(rng.integers(2, 80)), 0),
        (int(rng.integers(30, 45)), int(rng.integers(1, 100))),
        (0, int(rng.integers(0, 40))),  # a slot with nothing scheduled this step
        (33, 31),
        (int(rng.integers(1, 5)), int(rng.integers(100, 200))),
    ]


def attention_inputs(rng, requests, heads, kv_heads, head_dim, block_size):
    query_lens = np.array([q for q, _ in requests], np.int32)
    history = np.array([h for _, h in requests], np.int32)
    blocks_needed = -(-(query_lens + history) // block_size)
    max_blocks = int(blocks_needed.max()) + 2
    num_blocks = int(blocks_needed.sum()) + 3
    pool = rng.permutation(num_blocks)
    tables = np.full((len(requests), max_blocks), -1, np.int64)
    start = 0
    for i, count in enumerate(blocks_needed):
        tables[i, :count] = pool[start : start + count]
        start += count
    cu = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    slots = []
    for i, (q, h) in enumerate(requests):
        positions = h + np.arange(q)
        slots.append(tables[i, positions // block_size] * block_size + positions % block_size)
    slot_mapping = np.concatenate(slots).astype(np.int64)
    n = int(cu[-1])
    qkv = rng.standard_normal((n, (heads + 2 * kv_heads) * head_dim)).astype(np.float32)
    cache_shape = (num_blocks, kv_heads, block_size, head_dim)
    key_cache = rng.standard_normal(cache_shape).astype(np.float32)
    value_cache = rng.standard_normal(cache_shape).astype(np.float32)
    return qkv, key_cache, value_cache, slot_mapping, tables, cu, history


def write_cache_reference(qkv, key_cache, value_cache, slot_mapping, heads, kv_heads, head_dim):
    """Caches [num_blocks, kv_heads, block_size, head_dim] after this step's K/V writes (copies)."""
    key_cache, value_cache = key_cache.copy(), value_cache.copy()
    block_size = key_cache.shape[2]
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].reshape(-1, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].reshape(-1, kv_heads, head_dim)
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    key_cache[blocks, :, offsets] = k
    value_cache[blocks, :, offsets] = v
    return key_cache, value_cache


def attention_reference(qkv, key_cache, value_cache, tables, cu, history, heads, kv_heads, head_dim, scale):
    """out [num_tokens, heads * head_dim], float64: causal softmax attention per request (GQA)."""
    group, block_size = heads // kv_heads, key_cache.shape[2]
    q_all = qkv[:, : heads * head_dim].astype(np.float64).reshape(-1, kv_heads, group, head_dim)
    out = np.zeros((qkv.shape[0], heads * head_dim))
    for i in range(len(history)):
        a, b = int(cu[i]), int(cu[i + 1])
        if a == b:
            continue
        length = int(history[i]) + b - a
        blocks = tables[i, : -(-length // block_size)]
        k = key_cache[blocks].astype(np.float64).transpose(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)[:, :length]
        v = value_cache[blocks].astype(np.float64).transpose(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)[:, :length]
        scores = np.einsum("tkgd,kld->tkgl", q_all[a:b], k) * scale  # [t, kv_heads, group, length]
        visible = np.arange(length)[None, :] <= int(history[i]) + np.arange(b - a)[:, None]  # [t, length]
        scores = np.where(visible[:, None, None, :], scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        out[a:b] = np.einsum("tkgl,kld->tkgd", probs, v).reshape(b - a, heads * head_dim)
    return out


def run_attention_case(lib, device, rng, dtype, heads, kv_heads, head_dim, block_size, tables_int64):
    requests = ragged_requests(rng, block_size)
    qkv, key_cache, value_cache, slot_mapping, tables, cu, history = attention_inputs(
        rng, requests, heads, kv_heads, head_dim, block_size)
    # the reference sees exactly the rounded values the kernel reads
    qkv_s, key_s, value_s = (to_storage(x, dtype) for x in (qkv, key_cache, value_cache))
    qkv_r, key_r, value_r = (from_storage(x, dtype) for x in (qkv_s, key_s, value_s))
    exp_key, exp_value = write_cache_reference(qkv_r, key_r, value_r, slot_mapping, heads, kv_heads, head_dim)
    scale = head_dim**-0.5
    expected = attention_reference(qkv_r, exp_key, exp_value, tables, cu, history, heads, kv_heads, head_dim, scale)

    n, st = qkv.shape[0], storage_dtype(dtype)
    d_key, d_value = device.upload(key_s), device.upload(value_s)
    d_out = device.empty((n, heads * head_dim), st)
    d_tables = device.upload(tables if tables_int64 else tables.astype(np.int32))
    check_call(lib, "fd_append_attention", device.upload(qkv_s), d_key, d_value, device.upload(slot_mapping),
               d_tables, int(tables_int64), device.upload(cu), device.upload(history), d_out, dtype, n,
               len(requests), heads, kv_heads, head_dim, block_size, tables.shape[1], scale)
    got_key = from_storage(device.download(d_key, key_s.shape, st), dtype)
    got_value = from_storage(device.download(d_value, value_s.shape, st), dtype)
    got = from_storage(device.download(d_out, (n, heads * head_dim), st), dtype)
    device.reset()
    cache_ok = np.array_equal(got_key, exp_key) and np.array_equal(got_value, exp_value)
    return float(np.abs(got - expected).max()), cache_ok


def check_attention(lib, device, rng, table: Table):
    for dtype in (F32, F16, BF16):
        for heads, kv_heads in ((4, 4), (6, 2), (16, 2)):  # GQA ratios 1, 3, 8
            for head_dim in (64, 128):
                for block_size, tables_int64 in ((16, False), (64, True)):
                    if dtype != F32 and block_size == 16:
                        continue  # the half types share every index path with float32
                    error, cache_ok = run_attention_case(lib, device, rng, dtype, heads, kv_heads, head_dim,
                                                         block_size, tables_int64)
                    tol = ATTENTION_TOL[dtype]
                    name = (f"attention {DTYPE_NAMES[dtype]} H{heads}/KV{kv_heads} D{head_dim} "
                            f"bs{block_size} {'i64' if tables_int64 else 'i32'}")
                    table.add(name, 1, error, tol, error <= tol and cache_ok)
                    if not cache_ok:
                        print(f"  {name}: the KV cache after the write differs from the expected one")

