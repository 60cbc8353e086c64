"""--bench: microseconds per call of append attention (decode and prefill shapes), sampling and the token bitmask."""
import time

import numpy as np

from check_attention import attention_inputs
from check_token_bitmask import random_bitmask
from harness_common import DTYPE_NAMES, F16, F32, storage_dtype, to_storage
from harness_device import check_call


def time_call(lib, name: str, args, repeats: int = 20) -> float:
    """Microseconds per call (launch + kernel, synchronized at the end)."""
    check_call(lib, name, *args)
    start = time.perf_counter()
    for _ in range(repeats):
        getattr(lib, name)(*args)
    check_call(lib, "fd_synchronize")
    return (time.perf_counter() - start) / repeats * 1e6


def bench(lib, device, rng):
    print("\ntimings (us per call)")
    for dtype, batch, context, query in ((F16, 64, 1024, 1), (F32, 64, 1024, 1), (F16, 1, 0, 2048)):
        heads, kv_heads, head_dim, block_size = 16, 2, 128, 64
        requests = [(query, context)] * batch
        qkv, key, value, slots, tables, cu, history = attention_inputs(rng, requests, heads, kv_heads, head_dim,
                                                                       block_size)
        n, st = qkv.shape[0], storage_dtype(dtype)
        args = (device.upload(to_storage(qkv, dtype)), device.upload(to_storage(key, dtype)),
                device.upload(to_storage(value, dtype)), device.upload(slots), device.upload(tables), 1,
                device.upload(cu), device.upload(history), device.empty((n, heads * head_dim), st), dtype, n, batch,
                heads, kv_heads, head_dim, block_size, tables.shape[1], head_dim**-0.5)
        us = time_call(lib, "fd_append_attention", args)
        kv_bytes = 2 * batch * (context + query) * kv_heads * head_dim * np.dtype(st).itemsize
        print(f"  append_attention {DTYPE_NAMES[dtype]} batch {batch} context {context} query {query} "
              f"H{heads}/KV{kv_heads} D{head_dim}: {us:.1f} us, KV read {kv_bytes / us / 1e3:.1f} GB/s")
        device.reset()
    for label, top_k, top_p in (("greedy", 0, 1.0), ("top-k 50 + top-p 0.9", 50, 0.9), ("top-p 0.9", 0, 0.9),
                                ("full distribution", 0, 1.0)):
        rows, vocab = 64, 151936
        logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
        temperature = np.full(rows, 0.0 if label == "greedy" else 0.8, np.float32)
        args = (device.upload(logits), rows, vocab, device.upload(temperature),
                device.upload(np.full(rows, top_k, np.int64)), device.upload(np.full(rows, top_p, np.float32)),
                device.upload(np.zeros(rows, np.float32)), device.upload(rng.random(rows)),
                device.empty((rows, vocab), np.float32), device.empty(rows, np.int64))
        print(f"  sampling {rows} x {vocab} {label}: {time_call(lib, 'fd_sample', args):.1f} us")
        device.reset()
    rows, vocab = 32, 151936
    words = (vocab + 31) // 32
    json_like = np.zeros((rows, words), np.int32)  # a few hundred allowed tokens per row, the rest banned
    json_like[:, rng.choice(words, 8, replace=False)] = -1
    for label, bitmask in (("mixed words", random_bitmask(rng, rows, words)), ("JSON-like, 256 allowed", json_like)):
        logits = rng.standard_normal((rows, vocab)).astype(np.float32)
        args = (device.upload(logits), rows, vocab, device.upload(bitmask), words,
                device.upload(np.arange(rows, dtype=np.int64)), rows)
        us = time_call(lib, "fd_apply_token_bitmask", args, repeats=100)
        print(f"  token_bitmask {rows} x {vocab} {label}: {us:.1f} us, logits {logits.nbytes / us / 1e3:.0f} GB/s")
        device.reset()
