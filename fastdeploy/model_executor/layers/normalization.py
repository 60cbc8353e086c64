"""RMSNorm (Zhang & Sennrich 2019) as a layer, with the residual add of a pre-norm block fused in, and
LayerNorm (Ba et al. 2016) with weight and bias.

RMSNorm: out = x * rsqrt(mean(x^2, -1) + eps) * weight, in float32 (transformers' LlamaRMSNorm). The
kernels (compiled `fd_rms_norm` / `fd_fused_add_rms_norm`, or the pure-Paddle reference of
ops/normalization.py) are chosen when the layer is built.
LayerNorm: out = (x - mean) * rsqrt(var + eps) * weight + bias over the last axis, in float32
(torch.nn.LayerNorm; Paddle's F.layer_norm): the vision tower's and the text encoders' norm.
"""
from typing import Optional

import paddle
import paddle.nn.functional as F

from fastdeploy.model_executor.layers.parameters import empty_parameter
from fastdeploy.model_executor.ops import compiled_op
from fastdeploy.model_executor.ops.normalization import paddle_fused_add_rms_norm, paddle_rms_norm


class RMSNorm(paddle.nn.Layer):
    """Parameter `weight` [size] float32; normalises the last axis (size) of its input."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = empty_parameter([size])
        self._norm = compiled_op("fd_rms_norm") or paddle_rms_norm
        self._add_norm = compiled_op("fd_fused_add_rms_norm") or paddle_fused_add_rms_norm

    def forward(self, x: paddle.Tensor, residual: Optional[paddle.Tensor] = None):
        """x: [..., size]. Without residual: the normalised x. With residual (shaped like x): the pair
        (norm(x + residual), x + residual), the second being the new residual stream."""
        if residual is None:
            return self._norm(x, self.weight, self.eps)
        out, new_residual = self._add_norm(x, residual, self.weight, self.eps)
        return out, new_residual


class LayerNorm(paddle.nn.Layer):
    """Parameters `weight`, `bias` [size] float32; normalises the last axis (size) of its input."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = empty_parameter([size])
        self.bias = empty_parameter([size])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)  # [..., size] -> same
