"""`vision_attention`: non-causal attention within segments (a vision transformer's frames).

Runs the compiled op of custom_ops/cpu_ops/vision_attention.cc (flash-attention blocking, float32
register tiles), or `paddle_vision_attention`, its reference: per segment and block of query rows,
softmax(q k^T * scale) v with Paddle matmuls.
"""
import numpy as np
import paddle
import paddle.nn.functional as F

from fastdeploy.model_executor.ops.loader import compiled_op

QUERY_BLOCK = 64  # Paddle path: query rows at once (bounds the [heads, rows, segment] scores)


def vision_attention(qkv: paddle.Tensor, cu_seqlens: paddle.Tensor, num_heads: int, scale: float) -> paddle.Tensor:
    """Attention output [n, num_heads * head_dim] float32.

    qkv: [n, 3 * num_heads * head_dim] contiguous float32, each row q heads | k heads | v heads (RoPE
        applied to q and k).
    cu_seqlens: [segments + 1] int64, 0 = c_0 < c_1 < ... < c_S = n: row t of segment f
        (c_f <= t < c_{f+1}) attends keys c_f .. c_{f+1} - 1, all of them.
    The compiled op (when built) raises OSError naming a bad input.
    """
    op = compiled_op("vision_attention")
    if op is not None:
        return op(qkv, cu_seqlens, num_heads, scale)
    return paddle_vision_attention(qkv, cu_seqlens.numpy(), num_heads, scale)


def paddle_vision_attention(qkv: paddle.Tensor, cu_seqlens: np.ndarray, num_heads: int, scale: float) -> paddle.Tensor:
    """The pure-Paddle reference of `vision_attention` (same arguments, cu_seqlens as numpy)."""
    n = qkv.shape[0]
    dim = qkv.shape[1] // (3 * num_heads)
    heads = qkv.reshape([n, 3, num_heads, dim]).transpose([1, 2, 0, 3])  # [3, heads, n, dim]
    q, k, v = paddle.scale(heads[0], scale), heads[1], heads[2]
    out = []
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        k_f, v_f = k[:, start:end], v[:, start:end]
        for lo in range(start, end, QUERY_BLOCK):
            hi = min(end, lo + QUERY_BLOCK)
            probs = F.softmax(paddle.matmul(q[:, lo:hi], k_f, transpose_y=True), axis=-1)  # [heads, rows, length]
            out.append(paddle.matmul(probs, v_f))  # [heads, rows, dim]
    out = out[0] if len(out) == 1 else paddle.concat(out, axis=1)  # [heads, n, dim]
    return out.transpose([1, 0, 2]).reshape([n, num_heads * dim])
