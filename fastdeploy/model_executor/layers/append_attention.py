"""The compiled `append_attention` backend, and the one place a model's attention backend is chosen.

`AppendAttentionBackend` runs custom_ops/cpu_ops/append_attention.cc: one op call per layer writes
this step's K/V into the paged cache and attends in place through the block tables; the step's
metadata is four int64 tensors shared by every layer. `select_attention_backend` returns it when the
op is built (and fallbacks are not forced) and the shapes suit it (head_dim a multiple of 16,
block_size a multiple of 4), else the pure-Paddle `PaddleAttentionBackend` (layers/attention.py),
its reference. The model calls it once, at build.
"""
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import paddle

from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.attention import KVCache, PaddleAttentionBackend, compiled_append_attention


KERNEL_BEST = 0  # the op's `kernel` attribute: the fastest this CPU has (tests also run 1, no AMX)


@dataclass
class AppendAttentionInputs:
    """Per-step inputs of the compiled op (int64 tensors sharing memory with ForwardMeta's arrays)."""

    slot_mapping: paddle.Tensor  # [num_tokens]
    cu_seqlens_q: paddle.Tensor  # [bs + 1]
    seq_lens_decoder: paddle.Tensor  # [bs]
    block_tables: paddle.Tensor  # [bs, max_blocks], -1 padded


class AppendAttentionBackend:
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, op: Callable,
                 scale: Optional[float] = None):
        """op: the compiled `append_attention`; scale multiplies q.k before the softmax (head_dim ** -0.5 when None)."""
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.scale = head_dim**-0.5 if scale is None else scale
        self.op = op

    def init_attention_metadata(self, meta: ForwardMeta) -> AppendAttentionInputs:
        """The step's index tensors, shared by every layer (zero-copy views of meta's arrays)."""
        return AppendAttentionInputs(*[as_paddle(np.asarray(a, dtype=np.int64))
                                       for a in (meta.slot_mapping, meta.cu_seqlens_q, meta.seq_lens_decoder,
                                                 meta.block_tables)])

    def forward(self, qkv: paddle.Tensor, cache: KVCache, meta: AppendAttentionInputs) -> paddle.Tensor:
        # qkv: [num_tokens, (heads + 2 kv_heads) * head_dim] contiguous, RoPE applied -> [num_tokens, heads * head_dim]
        return self.op(qkv, cache.key_tensor, cache.value_tensor, meta.slot_mapping, meta.cu_seqlens_q,
                       meta.seq_lens_decoder, meta.block_tables, self.num_heads, self.scale, KERNEL_BEST)


def select_attention_backend(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                             scale: Optional[float] = None):
    """AppendAttentionBackend when the compiled op can run these shapes, else PaddleAttentionBackend."""
    op = compiled_append_attention(head_dim, block_size)
    if op is None:
        return PaddleAttentionBackend(num_heads, num_kv_heads, head_dim, block_size, scale)
    return AppendAttentionBackend(num_heads, num_kv_heads, head_dim, block_size, op, scale)
