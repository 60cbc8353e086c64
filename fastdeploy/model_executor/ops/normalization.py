"""RMSNorm (Zhang & Sennrich 2019) shims: the compiled ops of custom_ops/cpu_ops/rms_norm.cc, or pure Paddle.

Both paths compute transformers' LlamaRMSNorm in fp32: out = x * rsqrt(mean(x^2, -1) + eps) * weight,
with the mean square and its reciprocal square root in float32. The pure-Paddle functions here are
the reference the compiled ops are tested against (tests/model_executor/test_elementwise_ops.py).
"""
import paddle

from fastdeploy.model_executor.ops.loader import compiled_op


def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    """x normalised over its last axis, times weight: a new tensor shaped like x.

    x: [n, hidden] float32, or [n, heads, head_dim] for per-head q/k norms; weight: [last axis of x];
    eps: added to the mean square before the square root.
    """
    op = compiled_op("fd_rms_norm")
    return op(x, weight, eps) if op is not None else paddle_rms_norm(x, weight, eps)


def fused_add_rms_norm(x: paddle.Tensor, residual: paddle.Tensor, weight: paddle.Tensor,
                       eps: float) -> tuple[paddle.Tensor, paddle.Tensor]:
    """(rms_norm(x + residual), x + residual), both new tensors: the pre-norm layer's `h = h + f(h); y = norm(h)`.

    x, residual: [n, hidden] float32 (any shape, the same for both); weight: [hidden]. new_residual is
    exactly x + residual (float32 addition); out is rms_norm(new_residual, weight, eps).
    """
    op = compiled_op("fd_fused_add_rms_norm")
    if op is not None:
        out, new_residual = op(x, residual, weight, eps)
        return out, new_residual
    return paddle_fused_add_rms_norm(x, residual, weight, eps)


def paddle_rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    """The pure-Paddle reference of `rms_norm` (same arguments); x: [..., hidden], weight: [hidden]."""
    variance = (x * x).mean(axis=-1, keepdim=True)  # x.pow(2) is ~60x slower on Paddle's CPU kernels
    return x * paddle.rsqrt(variance + eps) * weight


def paddle_fused_add_rms_norm(x: paddle.Tensor, residual: paddle.Tensor, weight: paddle.Tensor,
                              eps: float) -> tuple[paddle.Tensor, paddle.Tensor]:
    """The pure-Paddle reference of `fused_add_rms_norm` (same arguments and results)."""
    new_residual = x + residual
    return paddle_rms_norm(new_residual, weight, eps), new_residual
