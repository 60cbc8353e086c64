"""ERNIE-4.5-VL's resampler: vision-tower rows -> text-model embeddings (transformers 5.23
Ernie4_5_VLMoeVariableResolutionResamplerModel; FastDeploy resampler.py VariableResolutionResamplerModel).

  x [N, vh] -> [N / 4, 4 vh]               the 4 rows of each 2 x 2 merge block side by side
  -> spatial_linear (fc1, GELU, fc2, LayerNorm)                          [N / 4, 4 vh]
  -> frame pairs side by side: frames (0, 1), (2, 3), ... of a video; an image's only frame with
     itself                                                             [tokens, 8 vh]
  -> temporal_linear (fc1, GELU, fc2, LayerNorm)                         [tokens, 4 vh]
  -> mlp (Linear to the text hidden size) -> after_norm (RMSNorm)         [tokens, text hidden]
GELU is the exact (erf) one; the LayerNorms use the vision eps, after_norm the text one. An item
(t, h, w) gives max(t / 2, 1) * h * w / 4 tokens, in its placeholders' order.
The linear layers take the engine's linear method as the vision tower's (vision.py `encoder_linear`).
Parameter names are the checkpoint's under `model.resampler_model.` (`spatial_linear.0/2/3`: the
original nn.Sequential's indices).
"""
from typing import Optional

import numpy as np
import paddle
import paddle.nn.functional as F

from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.linear import QuantConfig
from fastdeploy.model_executor.layers.normalization import LayerNorm, RMSNorm
from fastdeploy.model_executor.models.ernie4_5_vl.config import VLConfig
from fastdeploy.model_executor.models.ernie4_5_vl.vision import encoder_linear


class GELU(paddle.nn.Layer):
    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return F.gelu(x, approximate=False)


def _merge_mlp(in_dim: int, out_dim: int, eps: float, quant_config: Optional[QuantConfig],
               prefix: str) -> paddle.nn.Sequential:
    return paddle.nn.Sequential(encoder_linear(in_dim, out_dim, quant_config, f"{prefix}.0"), GELU(),
                                encoder_linear(out_dim, out_dim, quant_config, f"{prefix}.2"), LayerNorm(out_dim, eps))


def tokens_of(grid_thw: tuple, spatial_merge: int = 2, temporal_merge: int = 2) -> int:
    """Embeddings an item (t, h, w) becomes: its placeholder count."""
    t, h, w = grid_thw
    return max(t // temporal_merge, 1) * (h // spatial_merge) * (w // spatial_merge)


def frame_pairs(grid_thw: list, spatial_merge: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (first, second) into the merged rows [sum t * h * w / 4] of the frame pairs
    (an image: its frame twice)."""
    first, second, offset = [], [], 0
    for t, h, w in grid_thw:
        per_frame = (h // spatial_merge) * (w // spatial_merge)
        for even in range(0, t, 2):
            odd = even + 1 if t > 1 else even
            first.append(offset + even * per_frame + np.arange(per_frame))
            second.append(offset + odd * per_frame + np.arange(per_frame))
        offset += t * per_frame
    return np.concatenate(first), np.concatenate(second)


class Resampler(paddle.nn.Layer):
    """quant_config: the engine's (None: float32 weights); prefix: the checkpoint names' (`model.resampler_model`)."""

    def __init__(self, config: VLConfig, quant_config: Optional[QuantConfig] = None,
                 prefix: str = "model.resampler_model"):
        super().__init__()
        vision = config.vision
        self.spatial_merge = vision.spatial_merge_size
        spatial_dim = vision.hidden_size * self.spatial_merge**2
        self.spatial_linear = _merge_mlp(spatial_dim, spatial_dim, vision.layer_norm_eps, quant_config,
                                         f"{prefix}.spatial_linear")
        self.temporal_linear = _merge_mlp(spatial_dim * vision.temporal_merge_size, spatial_dim,
                                          vision.layer_norm_eps, quant_config, f"{prefix}.temporal_linear")
        self.mlp = encoder_linear(spatial_dim, config.text_hidden_size, quant_config, f"{prefix}.mlp")
        self.after_norm = RMSNorm(config.text_hidden_size, config.text_rms_norm_eps)

    def forward(self, x: paddle.Tensor, grid_thw: list) -> paddle.Tensor:
        """x [N, vision hidden] (the vision tower's output), grid_thw [(t, h, w)] -> [tokens, text hidden]."""
        merged = self.spatial_linear(x.reshape([-1, x.shape[1] * self.spatial_merge**2]))  # [N / 4, 4 vh]
        first, second = frame_pairs(grid_thw, self.spatial_merge)
        paired = paddle.concat([paddle.gather(merged, as_paddle(first)),
                                paddle.gather(merged, as_paddle(second))], axis=1)  # [tokens, 8 vh]
        return self.after_norm(self.mlp(self.temporal_linear(paired)))
