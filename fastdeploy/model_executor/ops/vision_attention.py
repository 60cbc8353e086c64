"""`vision_attention`: non-causal attention within segments: a vision transformer's frames (ERNIE-4.5-VL's
tower), or the sequences of a text encoder's ragged batch (models/bert.py: BERT, XLM-RoBERTa). The name is
the op's first user's.

Runs the compiled op of custom_ops/cpu_ops/vision_attention.cc (flash-attention blocking, float32
register tiles), or `paddle_vision_attention`, its reference: per segment and block of query rows,
softmax(q k^T * scale) v with Paddle matmuls. `vision_attention_bf16` is the same attention with bf16
products (custom_ops/cpu_ops/vision_attention_bf16.cc: AMX tiles, AVX512-BF16 registers or portable
loops), for a vision tower computing in bf16; its reference is `paddle_vision_attention(..., bf16=True)`.
"""
import numpy as np
import paddle
import paddle.nn.functional as F

from fastdeploy.model_executor.ops.loader import compiled_op

QUERY_BLOCK = 64  # Paddle path: query rows at once (bounds the [heads, rows, segment] scores)
KERNELS = {"best": 0, "no_amx": 1, "portable": 2}  # vision_attention_bf16's `kernel` attribute


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


def vision_attention_bf16(qkv: paddle.Tensor, cu_seqlens: paddle.Tensor, num_heads: int, scale: float,
                          kernel: str = "best") -> paddle.Tensor:
    """`vision_attention` (same arguments and output) with q, k, v rounded to bf16 (nearest even), q k^T
    summed in float32 and scaled, an online softmax in float32, the probabilities rounded to bf16 for P V
    (summed in float32), divided by the float32 sum of the unrounded probabilities: PyTorch's CPU flash
    attention on bf16 inputs. head_dim must be a multiple of 16. kernel: "best" (AMX where the CPU and
    kernel allow it, else AVX512-BF16 registers, else portable loops), "no_amx" (registers where compiled,
    else portable), "portable" (the tests' check of the plain loops). ValueError on an unknown kernel; the
    compiled op raises OSError naming a bad input."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    op = compiled_op("vision_attention_bf16")
    if op is not None:
        return op(qkv, cu_seqlens, num_heads, scale, KERNELS[kernel])
    return paddle_vision_attention(qkv, cu_seqlens.numpy(), num_heads, scale, bf16=True)


def paddle_vision_attention(qkv: paddle.Tensor, cu_seqlens: np.ndarray, num_heads: int, scale: float,
                            bf16: bool = False) -> paddle.Tensor:
    """The pure-Paddle reference of `vision_attention` (same arguments, cu_seqlens as numpy); with bf16, of
    `vision_attention_bf16` with one softmax step per block of QUERY_BLOCK rows (q, k, v and the
    probabilities rounded to bf16, the sum of the unrounded ones)."""
    n = qkv.shape[0]
    dim = qkv.shape[1] // (3 * num_heads)
    if bf16:
        qkv = qkv.astype("bfloat16").astype("float32")
    heads = qkv.reshape([n, 3, num_heads, dim]).transpose([1, 2, 0, 3])  # [3, heads, n, dim]
    if bf16:
        return _bf16_blocks(heads, cu_seqlens, scale).transpose([1, 0, 2]).reshape([n, num_heads * dim])
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


def _bf16_blocks(heads: paddle.Tensor, cu_seqlens: np.ndarray, scale: float) -> paddle.Tensor:
    """heads [3, heads, n, dim] (bf16-valued float32) -> [heads, n, dim], exact softmax per query block."""
    q, k, v = heads[0], heads[1], heads[2]
    out = []
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        k_f, v_f = k[:, start:end], v[:, start:end]
        for lo in range(start, end, QUERY_BLOCK):
            s = paddle.scale(paddle.matmul(q[:, lo:min(end, lo + QUERY_BLOCK)], k_f, transpose_y=True), scale)
            p = paddle.exp(s - s.max(axis=-1, keepdim=True))  # [heads, rows, length]
            rounded = p.astype("bfloat16").astype("float32")
            out.append(paddle.matmul(rounded, v_f) / p.sum(axis=-1, keepdim=True))  # [heads, rows, dim]
    return out[0] if len(out) == 1 else paddle.concat(out, axis=1)
