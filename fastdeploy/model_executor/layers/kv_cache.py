"""KV-cache storage: the per-layer key/value tensors every attention backend reads and writes.

Layout per layer: key and value `[num_blocks, kv_heads, block_size, head_dim]` (FastDeploy's
layout); block b holds tokens of whichever sequence's block table names b (block 0 is the null
block, cache_manager/block_pool.py). Each is one contiguous buffer seen two ways: a numpy array
`[num_blocks * kv_heads, block_size, head_dim]` (one (block, kv head) pair per row, for the
pure-Paddle backend's gathers and writes, layers/attention.py) and a Paddle tensor of the 4-D
layout over the same memory (DLPack, no copy) for the compiled `append_attention` op.

Dtype (`KV_CACHE_DTYPES`): float32, or bfloat16 for models that compute in bf16 (the engine picks it
from the weight format: layers/quantization/weight_format.py). numpy has no bfloat16, so a bf16 cache
is held as uint16 arrays of bf16 bits, which DLPack hands Paddle as uint16 tensors: the compiled op
takes those (and Paddle bfloat16 tensors) as bf16. `KV_CACHE_BYTES` gives the bytes per element,
which the KV pool is sized with (cache_manager/kv_cache_sizing.py).
"""
from dataclasses import dataclass

from typing import Optional

import numpy as np
import paddle

from fastdeploy.model_executor.host_arrays import as_paddle

# cache dtype name -> the numpy dtype its arrays hold (bf16 as its uint16 bit patterns)
KV_CACHE_DTYPES = {"float32": np.float32, "bfloat16": np.uint16}
KV_CACHE_BYTES = {name: np.dtype(held).itemsize for name, held in KV_CACHE_DTYPES.items()}


@dataclass
class KVCache:
    """One layer's cache: numpy arrays [num_blocks * kv_heads, block_size, head_dim] for writes and
    gathers, and Paddle views of the same memory [num_blocks, kv_heads, block_size, head_dim] for ops.
    The arrays are float32, or uint16 holding bf16 bits (see the module docstring)."""

    key: np.ndarray
    value: np.ndarray
    key_tensor: paddle.Tensor
    value_tensor: paddle.Tensor

    @property
    def dtype(self) -> str:
        """"float32" or "bfloat16" (a key of KV_CACHE_DTYPES)."""
        return "bfloat16" if self.key.dtype == np.uint16 else "float32"

    @classmethod
    def of(cls, key: paddle.Tensor, value: paddle.Tensor) -> "KVCache":
        """The cache over existing contiguous [num_blocks, kv_heads, block_size, head_dim] tensors
        (shared): float32, or bf16 (Paddle bfloat16, or uint16 holding bf16 bits). ValueError otherwise."""
        if key.dtype != value.dtype or key.dtype not in (paddle.float32, paddle.bfloat16, paddle.uint16):
            raise ValueError(f"KV cache tensors must both be float32 or both bf16 (bfloat16, or uint16 holding "
                             f"bf16 bits), got {key.dtype} and {value.dtype}")
        blocks, kv_heads, block_size, head_dim = key.shape
        rows = (blocks * kv_heads, block_size, head_dim)
        arrays = [np.from_dlpack(t.view(paddle.uint16) if t.dtype == paddle.bfloat16 else t) for t in (key, value)]
        return cls(arrays[0].reshape(rows), arrays[1].reshape(rows), key, value)


def allocate_kv_cache(num_blocks: int, kv_heads: int, block_size: int, head_dim: int,
                      dtype: str = "float32") -> KVCache:
    """Zeroed cache of `dtype` ("float32" or "bfloat16", see KV_CACHE_DTYPES); np.zeros maps zero pages
    lazily (np.zeros_like would write every page), so memory is committed as blocks are used.
    ValueError for another dtype."""
    if dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"KV cache dtype must be one of {list(KV_CACHE_DTYPES)}, got {dtype!r}")
    rows = (num_blocks * kv_heads, block_size, head_dim)
    key, value = np.zeros(rows, KV_CACHE_DTYPES[dtype]), np.zeros(rows, KV_CACHE_DTYPES[dtype])
    shape = (num_blocks, kv_heads, block_size, head_dim)
    return KVCache(key, value, as_paddle(key.reshape(shape)), as_paddle(value.reshape(shape)))


def allocate_model_kv_caches(model_config, num_blocks: int, block_size: int, dtype: str,
                             layers: Optional[range] = None) -> list:
    """One cache per decoder layer of `model_config` (a config.py ModelConfig), each as allocate_kv_cache;
    with `layers` (a pipeline stage's), only those layers get one (None at the others' indices)."""
    return [allocate_kv_cache(num_blocks, model_config.num_key_value_heads, block_size, model_config.head_dim, dtype)
            if layers is None or i in layers else None
            for i in range(model_config.num_hidden_layers)]
