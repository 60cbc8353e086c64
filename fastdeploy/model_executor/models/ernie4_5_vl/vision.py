"""ERNIE-4.5-VL's vision transformer ("DFNRope" ViT; transformers 5.23
Ernie4_5_VLMoeVisionTransformerPretrainedModel, FastDeploy dfnrope/modeling.py).

pixel_values [N, C * p * p] (one row per p x p patch, channel-major, rows in the processor's
merge-block order: per frame [h / m, w / m, m, m], m = spatial_merge_size) -> patch_embed (Linear,
no bias) -> `depth` pre-norm blocks -> LayerNorm -> [N, hidden]. A block: x += proj(attention(rope(q), rope(k), v)) over
qkv = Linear(LayerNorm1(x)), then x += fc2(quick_gelu(fc1(LayerNorm2(x)))); quick_gelu(x) =
x * sigmoid(1.702 x). Attention is non-causal and sees only the patches of the same frame.
RoPE is 2-D axial, rotate-half: with head_dim d and inv_freq = theta^(-4j / d) (j < d / 4), pair
(k, k + d / 2) turns by h * inv_freq[k] for k < d / 4 and by w * inv_freq[k - d / 4] after, (h, w)
being the patch's row and column in its frame. Attention runs in ops/vision_attention.py: in float32
(`vision_attention`) when the qkv linear is dense float32, with bf16 products (`vision_attention_bf16`,
as transformers' bf16 sdpa) when it is packed (the engine computes in bf16), the CPU has AMX-BF16
tiles and head_dim is a multiple of 16 (80 in the real checkpoints). Without AMX (AMD Zen 4) the bf16
op's register-tile kernel is slower than the float32 op (benchmarks/README.md at commit 9c89004), so attention stays
float32 there. The linear layers (patch embed, qkv, proj, fc1, fc2)
take the engine's linear method (`encoder_linear`; fc1 applies quick_gelu itself, a packed fc1 where its
kernel writes the output): with `dtype="bfloat16"` / `quantization="wint8" |
"wint4"` they are packed as the text decoder's are (layers/quantization/packed.py; a layer whose
in_features the kind cannot take, e.g. the patch embed's 588 under wint4, stays float32); activations
stay float32 between ops.
Parameter names are the checkpoint's under `model.vision_model.`.
"""
from typing import Optional

import numpy as np
import paddle

from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.linear import (Linear, QuantConfig, UnquantizedLinearMethod, epilogue,
                                                     select_linear_method)
from fastdeploy.model_executor.layers.normalization import LayerNorm
from fastdeploy.model_executor.layers.quantization.packed import PackedLinearMethod
from fastdeploy.model_executor.layers.quantization.weight_format import cpu_has_amx_bf16
from fastdeploy.model_executor.models.ernie4_5_vl.config import VisionConfig
from fastdeploy.model_executor.models.ernie4_5_vl.mrope import rotation_tables
from fastdeploy.model_executor.ops.rotary_embedding import rotary_embedding_
from fastdeploy.model_executor.ops.vision_attention import vision_attention, vision_attention_bf16
from fastdeploy.platforms.cpu import is_amd_cpu

ROW_BLOCK = 512


class RowBlockedLinearMethod(UnquantizedLinearMethod):
    """Dense float32 x @ W, in blocks of ROW_BLOCK rows of x: on AMD CPUs Paddle 3.3's CPU matmul (MKL)
    is several times slower on a thousand-plus rows against a large square weight (the resampler's
    [5120, 5120]) in one call than in row blocks; on Intel CPUs one call is faster
    (benchmarks/README.md at commit 9c89004, benchmark_vl_encode.py). Each row's result is the same
    computation either way."""

    def apply(self, layer: Linear, x: paddle.Tensor) -> paddle.Tensor:
        if x.shape[0] <= ROW_BLOCK:
            return epilogue(layer, paddle.matmul(x, layer.weight))
        return epilogue(layer, paddle.concat([paddle.matmul(x[i : i + ROW_BLOCK], layer.weight)
                                              for i in range(0, x.shape[0], ROW_BLOCK)]))  # [n, in] @ [in, out]


def linear_method() -> UnquantizedLinearMethod:
    """The vision encoder's and resampler's dense float32 method: row blocks on AMD CPUs, one matmul elsewhere."""
    return RowBlockedLinearMethod() if is_amd_cpu() else UnquantizedLinearMethod()


def encoder_linear(in_features: int, out_features: int, quant_config: Optional[QuantConfig], name: str,
                   bias: bool = True, activation: Optional[str] = None) -> Linear:
    """A vision-tower or resampler Linear for checkpoint tensor `name` (its `.weight`): dense float32
    (`linear_method`) for float32 weights (quant_config None), else the method the engine chose
    (layers/linear.py select_linear_method), as every text-decoder Linear; `activation` as Linear's."""
    method = linear_method() if quant_config is None else select_linear_method(quant_config, [f"{name}.weight"])
    return Linear(in_features, {None: out_features}, bias, method, activation)


def patch_positions(grid_thw: list, merge: int = 2) -> np.ndarray:
    """[N, 2] (row, column) of every patch of the items (t, h, w), in the order of merge x merge blocks,
    frame by frame."""
    parts = []
    for t, h, w in grid_thw:
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")  # [h, w]
        block = (h // merge, merge, w // merge, merge)
        frame = np.stack([rows.reshape(block).transpose(0, 2, 1, 3).reshape(-1),
                          cols.reshape(block).transpose(0, 2, 1, 3).reshape(-1)], axis=1)
        parts.append(np.tile(frame, (t, 1)))
    return np.concatenate(parts)


class VisionAttention(paddle.nn.Layer):
    def __init__(self, hidden: int, num_heads: int, quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden // num_heads
        self.qkv = encoder_linear(hidden, 3 * hidden, quant_config, f"{prefix}.qkv")
        self.proj = encoder_linear(hidden, hidden, quant_config, f"{prefix}.proj")
        # packed bf16 / wint8 / wint4 linears: the tower computes in bf16, attention too where AMX runs it
        packed = isinstance(self.qkv.method, PackedLinearMethod) and self.qkv.method.packed
        bf16 = packed and self.head_dim % 16 == 0 and cpu_has_amx_bf16()  # vision_attention_bf16's tiles
        self.attention = vision_attention_bf16 if bf16 else vision_attention

    def forward(self, x: paddle.Tensor, rope: tuple, cu_seqlens: paddle.Tensor) -> paddle.Tensor:
        # x: [N, hidden]; rope: (rows, cos, sin_signed); cu_seqlens: [frames + 1] patch rows of the frames
        qkv = self.qkv(x)  # [N, 3 hidden] = q heads | k heads | v heads
        rotary_embedding_(qkv, *rope, self.num_heads, self.num_heads, self.head_dim)
        return self.proj(self.attention(qkv, cu_seqlens, self.num_heads, self.head_dim**-0.5))


class VisionMLP(paddle.nn.Layer):
    def __init__(self, hidden: int, intermediate: int, quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        # quick_gelu applied by fc1 (a packed fc1 in its kernel's pass over the output)
        self.fc1 = encoder_linear(hidden, intermediate, quant_config, f"{prefix}.fc1", activation="quick_gelu")
        self.fc2 = encoder_linear(intermediate, hidden, quant_config, f"{prefix}.fc2")

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.fc2(self.fc1(x))


class VisionBlock(paddle.nn.Layer):
    def __init__(self, config: VisionConfig, quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        self.norm1 = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.norm2 = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.attn = VisionAttention(config.hidden_size, config.num_heads, quant_config, f"{prefix}.attn")
        self.mlp = VisionMLP(config.hidden_size, config.intermediate_size, quant_config, f"{prefix}.mlp")

    def forward(self, x: paddle.Tensor, rope: tuple, cu_seqlens: paddle.Tensor) -> paddle.Tensor:
        x = x + self.attn(self.norm1(x), rope, cu_seqlens)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(paddle.nn.Layer):
    def __init__(self, patch_dim: int, hidden: int, quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        self.proj = encoder_linear(patch_dim, hidden, quant_config, f"{prefix}.proj", bias=False)

    def forward(self, pixel_values: paddle.Tensor) -> paddle.Tensor:
        return self.proj(pixel_values)


class VisionTransformer(paddle.nn.Layer):
    """quant_config: the engine's (None: float32 weights); prefix: the checkpoint names' (`model.vision_model`)."""

    def __init__(self, config: VisionConfig, quant_config: Optional[QuantConfig] = None,
                 prefix: str = "model.vision_model"):
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config.patch_dim, config.hidden_size, quant_config, f"{prefix}.patch_embed")
        self.blocks = paddle.nn.LayerList([VisionBlock(config, quant_config, f"{prefix}.blocks.{i}")
                                           for i in range(config.depth)])
        self.ln = LayerNorm(config.hidden_size, config.layer_norm_eps)
        head_dim = config.hidden_size // config.num_heads
        quarter = np.arange(0, head_dim // 2, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim // 2)
        self.inv_freq = (np.float32(1.0) / (np.float32(config.rope_theta) ** quarter)).astype(np.float32)  # [d / 4]

    def rope_tables(self, grid_thw: list) -> tuple:
        """(rows [N], cos [N, d], sin_signed [N, d]) of every patch of the items."""
        positions = patch_positions(grid_thw, self.config.spatial_merge_size).astype(np.float32)  # [N, 2]
        angles = np.concatenate([positions[:, :1] * self.inv_freq, positions[:, 1:] * self.inv_freq], axis=1)
        cos, sin_signed = rotation_tables(angles)  # [N, d / 2] angles -> [N, d]
        return paddle.arange(positions.shape[0], dtype="int64"), cos, sin_signed

    def forward(self, pixel_values: paddle.Tensor, grid_thw: list) -> paddle.Tensor:
        """pixel_values [N, C * p * p] float32, grid_thw [(t, h, w)] per item (N = sum t * h * w)
        -> [N, hidden]. ValueError when the rows do not match the grids."""
        expected = sum(t * h * w for t, h, w in grid_thw)
        if pixel_values.shape != [expected, self.config.patch_dim]:
            raise ValueError(f"pixel_values has shape {pixel_values.shape}, grid_thw {grid_thw} implies "
                             f"[{expected}, {self.config.patch_dim}]")
        frame_sizes = [h * w for t, h, w in grid_thw for _ in range(t)]
        cu_seqlens = as_paddle(np.concatenate([[0], np.cumsum(frame_sizes)]).astype(np.int64))
        rope = self.rope_tables(grid_thw)
        x = self.patch_embed(pixel_values)  # [N, hidden]
        for block in self.blocks:
            x = block(x, rope, cu_seqlens)
        return self.ln(x)
