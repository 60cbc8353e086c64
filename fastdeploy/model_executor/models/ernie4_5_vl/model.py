"""ERNIE-4.5-VL (e.g. ERNIE-4.5-VL-28B-A3B; transformers' Ernie4_5_VLMoeForConditionalGeneration).

vision tower (vision.py) -> resampler (resampler.py) -> embeddings put at the placeholder tokens
-> ERNIE-4.5's decoder (models/ernie4_5.py: interleaved RoPE by q/k row reordering, optional
biases) with 3-D M-RoPE (mrope.py) and, from the first sparse layer on, modality-isolated MoE
(moe.py) -> final RMSNorm -> tied lm_head.

Runner-facing calls, beyond models/__init__.py's contract:
- `embed_multimodal(features)`: MultiModalFeature list -> one [feature.length, hidden] float32 tensor
  each (vision tower + resampler over all of them at once).
- `forward(input_ids, positions, forward_meta, inputs_embeds=None)`: input_ids is required even with
  inputs_embeds, because tokens go to the vision experts by id: placeholders (image, video) and the
  image/video start/end delimiters, in prefill and decode alike (transformers' processor marks
  the same tokens in `moe_mm_token_type_ids`). positions: [3, n] (t, h, w), or [n] for text only.
Checkpoint names are the original PT layout (config.py for the config formats): `model.` text
parts, `model.vision_model.*`, `model.resampler_model.*`, no lm_head when tied.
"""
import dataclasses
from typing import Optional

import numpy as np
import paddle

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.linear import QuantConfig
from fastdeploy.model_executor.layers.mlp import DenseMLP
from fastdeploy.model_executor.models.ernie4_5 import Ernie4_5ForCausalLM
from fastdeploy.model_executor.models.ernie4_5_vl.config import VLConfig
from fastdeploy.model_executor.models.ernie4_5_vl.moe import ModalityIsolatedMoE
from fastdeploy.model_executor.models.ernie4_5_vl.mrope import MRotaryEmbedding
from fastdeploy.model_executor.models.ernie4_5_vl.resampler import Resampler, tokens_of
from fastdeploy.model_executor.models.ernie4_5_vl.vision import VisionTransformer


class Ernie4_5_VLMoeForConditionalGeneration(Ernie4_5ForCausalLM):
    def __init__(self, config: ModelConfig, block_size: int, max_model_len: int,
                 quant_config: Optional[QuantConfig] = None):
        super().__init__(config, block_size, max_model_len, quant_config)
        self.vl_config = vl = VLConfig.from_hf(config.hf_config)
        self.model.vision_model = VisionTransformer(vl.vision, quant_config)  # linears as the decoder's
        self.model.resampler_model = Resampler(vl, quant_config)
        self._vision_ids = np.asarray(vl.token_ids.vision, dtype=np.int64)

    def make_rope(self, config: ModelConfig, max_model_len: int) -> MRotaryEmbedding:
        return MRotaryEmbedding(config.head_dim, config.rope_theta, VLConfig.from_hf(config.hf_config).mrope_section)

    def make_mlp(self, config: ModelConfig, layer_index: int, quant_config: Optional[QuantConfig], prefix: str):
        vl = VLConfig.from_hf(config.hf_config)
        if vl.sparse_layers[layer_index]:
            return ModalityIsolatedMoE(config.hidden_size, vl, quant_config, prefix)
        return DenseMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, quant_config, prefix)

    def forward(self, input_ids: Optional[paddle.Tensor], positions: paddle.Tensor, forward_meta: ForwardMeta,
                inputs_embeds: Optional[paddle.Tensor] = None) -> paddle.Tensor:
        """Final hidden states [n, hidden]; the MoE layers receive the routing modality (1 for the
        vision-expert ids, else 0) in place of forward_meta.token_type_ids."""
        if input_ids is None:
            raise ValueError("ERNIE-4.5-VL routes tokens to its text or vision experts by id: input_ids is "
                             "required, also when inputs_embeds is given")
        modality = as_paddle(np.isin(input_ids.numpy(), self._vision_ids).astype(np.int64))  # [n]
        meta = dataclasses.replace(forward_meta, token_type_ids=modality)
        return self.model(input_ids, positions, meta, inputs_embeds)

    def encode_vision(self, pixel_values: paddle.Tensor, grid_thw: list) -> paddle.Tensor:
        """pixel_values [sum t*h*w, C*p*p] float32 of items grid_thw [(t, h, w)] (images: t = 1; videos:
        t even) -> embeddings [sum of tokens_of(item), text hidden], item after item."""
        for t, h, w in grid_thw:
            m = self.vl_config.vision.spatial_merge_size
            if h % m or w % m or (t > 1 and t % 2):
                raise ValueError(f"grid_thw ({t}, {h}, {w}): h and w must be multiples of {m}, and t 1 or even")
        return self.model.resampler_model(self.model.vision_model(pixel_values, grid_thw), grid_thw)

    def embed_multimodal(self, features: list) -> list[paddle.Tensor]:
        """The embeddings [feature.length, hidden] of each multimodal/inputs.py MultiModalFeature, in
        order. ValueError when a feature's length differs from what its grid gives."""
        vision = self.vl_config.vision
        for f in features:
            expected = tokens_of(tuple(f.grid_thw), vision.spatial_merge_size, vision.temporal_merge_size)
            if f.length != expected:
                raise ValueError(f"{f.modality} with grid_thw {tuple(f.grid_thw)} gives {expected} embeddings, "
                                 f"but its length is {f.length}")
        grids = [tuple(int(v) for v in f.grid_thw) for f in features]
        pixels = as_paddle(np.concatenate([np.asarray(f.pixel_values, np.float32) for f in features]))
        embeddings = self.encode_vision(pixels, grids)  # [sum of lengths, hidden]
        return list(paddle.split(embeddings, [f.length for f in features], axis=0))
