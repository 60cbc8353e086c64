"""`append_attention`: write a step's K/V into the paged cache, then attend causally (GQA), one layer.

Runs the compiled op of custom_ops/cpu_ops/append_attention.cc, or the pure-Paddle path of
PaddleAttentionBackend (layers/attention.py), which is its reference. The model goes through the
backend, which builds the step's metadata once for all layers; this function is the op on its
own (tests, tools), building what it needs on every call.
"""
import numpy as np
import paddle

from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.attention import KVCache, PaddleAttentionBackend, compiled_append_attention
from fastdeploy.model_executor.layers.append_attention import KERNEL_BEST


def append_attention(qkv: paddle.Tensor, key_cache: paddle.Tensor, value_cache: paddle.Tensor,
                     slot_mapping: paddle.Tensor, cu_seqlens_q: paddle.Tensor, seq_lens_decoder: paddle.Tensor,
                     block_tables: paddle.Tensor, num_heads: int, scale: float,
                     kernel: int = KERNEL_BEST) -> paddle.Tensor:
    """Attention output [n, num_heads * head_dim] float32; writes K/V into the caches in place.

    qkv: [n, (num_heads + 2 kv_heads) * head_dim] contiguous float32, each row q heads | k heads |
        v heads, RoPE already applied to q and k.
    key_cache, value_cache: [num_blocks, kv_heads, block_size, head_dim] contiguous, both float32 or
        both bf16 (Paddle bfloat16, or uint16 holding bf16 bits; K/V written rounded to nearest even,
        read widened exactly; the math is float32), FastDeploy's layout; row t's K and V are written
        at slot_mapping[t]. ValueError for a strided view (Paddle would hand the op a copy, and the
        writes would be lost).
    slot_mapping: [n] int64, block * block_size + offset of each row's token.
    cu_seqlens_q: [bs + 1] int64, request i owns rows cu_seqlens_q[i] .. cu_seqlens_q[i + 1] - 1.
    seq_lens_decoder: [bs] int64, tokens of request i already cached before this step.
    block_tables: [bs, max_blocks] int64, -1 padded, covering every position of each request.
    scale: multiplies q.k before the softmax (usually head_dim ** -0.5).
    kernel: the compiled op's decode kernel over a bf16 cache: 0 the best the CPU has (AMX tiles on
        float32 operands split into exact bf16 parts, else FMAs), 1 FMAs (tests run both; the Paddle
        path ignores it).
    Query j of request i sits at position seq_lens_decoder[i] + j and attends keys 0 .. that
    position (softmax(q k^T * scale) v per head; query head h uses KV head h // (num_heads // kv_heads)).
    The compiled op checks shapes, block ids and slots and raises OSError (Paddle's type for C++
    errors) naming the bad input; the Paddle path indexes as given.
    """
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("append_attention writes the caches in place and needs contiguous tensors, got a strided view")
    _, kv_heads, block_size, head_dim = key_cache.shape
    op = compiled_append_attention(head_dim, block_size)
    if op is not None:
        return op(qkv, key_cache, value_cache, slot_mapping, cu_seqlens_q, seq_lens_decoder, block_tables,
                  num_heads, scale, kernel)
    backend = PaddleAttentionBackend(num_heads, kv_heads, head_dim, block_size, scale)
    cu = cu_seqlens_q.numpy()
    meta = ForwardMeta(seq_lens_this_time=np.diff(cu), seq_lens_decoder=seq_lens_decoder.numpy(), cu_seqlens_q=cu,
                       block_tables=block_tables.numpy(), slot_mapping=slot_mapping.numpy(), caches=[])
    return backend.forward(qkv, KVCache.of(key_cache, value_cache), backend.init_attention_metadata(meta))
