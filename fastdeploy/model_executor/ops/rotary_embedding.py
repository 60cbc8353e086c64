"""Rotary position embedding (RoPE, Su et al. 2021) applied in place to the fused qkv projection.

`rotary_embedding_` runs the compiled op of custom_ops/cpu_ops/rotary_embedding.cc, or the same math
with Paddle ops writing back into qkv. Layout: rotate-half ("NeoX", as Llama in transformers), with
the tables RotaryEmbedding (layers/rotary_embedding.py) holds: `cos` and `sin_signed`, each
[max_position, head_dim], sin_signed being sin with rotate_half's sign folded into its first half.
"""
import paddle

from fastdeploy.model_executor.ops.loader import compiled_op


def rotary_embedding_(qkv: paddle.Tensor, positions: paddle.Tensor, cos: paddle.Tensor, sin_signed: paddle.Tensor,
                      num_heads: int, num_kv_heads: int, head_dim: int) -> paddle.Tensor:
    """Rotates the q and k heads of every token of qkv by the token's position, in place; returns qkv.

    qkv: [n, (num_heads + 2 * num_kv_heads) * head_dim] contiguous float32, the fused projection (or
        any contiguous [n, ...] whose rows start with the num_heads q heads and num_kv_heads k heads,
        e.g. [n, heads, head_dim]); the rest of each row (v) is left bit-identical.
    positions: [n] int64, each in [0, max_position).
    cos, sin_signed: [max_position, head_dim], RotaryEmbedding's `cos` and `sin_signed`.
    Each head x = [x1, x2] becomes x * cos + roll(x, head_dim / 2) * sin_signed at its token's row,
    i.e. [x1 cos - x2 sin, x2 cos + x1 sin] (transformers' apply_rotary_pos_emb).
    Both paths write into qkv's memory and return qkv itself.
    Raises ValueError when qkv is not contiguous: Paddle hands custom ops a contiguous copy of a
    strided view, so the rotation would be lost.
    """
    if not qkv.is_contiguous():
        raise ValueError("rotary_embedding_ rotates qkv in place and needs a contiguous tensor, got a strided view")
    op = compiled_op("fd_rotary_embedding")
    if op is not None:
        op(qkv, positions, cos, sin_signed, num_heads, num_kv_heads, head_dim)
    else:
        paddle_rotary_embedding_(qkv, positions, cos, sin_signed, num_heads + num_kv_heads, head_dim)
    return qkv


def paddle_rotary_embedding_(qkv, positions, cos, sin_signed, rotated: int, head_dim: int) -> None:
    """The pure-Paddle reference of the compiled op: the first `rotated` heads of qkv
    [n, heads * head_dim] rotated in place by the cos/sin rows of `positions` [n]."""
    n = qkv.shape[0]
    heads = qkv.reshape([n, -1, head_dim])  # a view: writing into it writes into qkv
    x = heads[:, :rotated]  # [n, rotated, head_dim]
    shape = [n, rotated, head_dim]
    # expanded to full shape: Paddle's CPU elementwise kernels are ~25x slower broadcasting over a middle axis
    c = paddle.gather(cos, positions).unsqueeze(1).expand(shape).contiguous()
    s = paddle.gather(sin_signed, positions).unsqueeze(1).expand(shape).contiguous()
    heads[:, :rotated] = x * c + paddle.roll(x, head_dim // 2, axis=-1) * s
