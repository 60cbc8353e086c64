"""ERNIE-4.5-MoE (e.g. ERNIE-4.5-21B-A3B; transformers' Ernie4_5_MoeForCausalLM): ERNIE-4.5's
attention (interleaved RoPE, see ernie4_5.py); the MLP of layer i is a sparse MoE when
(i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <= moe_layer_end_index (earlier
layers stay dense), with a float32 softmax router, experts chosen by p + e_score_correction_bias
(`moe_statics`) but weighted by p, weights divided by max(sum, moe_norm_min), plus
`moe_num_shared_experts` shared experts (one MLP of moe_intermediate_size x that many).
Unlike the dense model, `use_bias` also gives lm_head a bias (as transformers builds it)."""
from typing import Optional

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.layers.linear import QuantConfig
from fastdeploy.model_executor.layers.mlp import DenseMLP
from fastdeploy.model_executor.layers.moe import SparseMoE
from fastdeploy.model_executor.models.causal_lm import with_flags
from fastdeploy.model_executor.models.ernie4_5 import Ernie4_5ForCausalLM


class Ernie4_5_MoeForCausalLM(Ernie4_5ForCausalLM):
    @classmethod
    def adapt_config(cls, config: ModelConfig) -> ModelConfig:
        return with_flags(super().adapt_config(config), lm_head_bias=config.use_bias)

    def make_mlp(self, config: ModelConfig, layer_index: int, quant_config: Optional[QuantConfig], prefix: str):
        hf = config.hf_config
        start = hf.get("moe_layer_start_index", 0)
        end = hf.get("moe_layer_end_index", config.num_hidden_layers - 1)
        sparse = (layer_index + 1) % hf.get("moe_layer_interval", 1) == 0 and start <= layer_index <= end
        if not sparse:
            return DenseMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, quant_config, prefix)
        inter = hf["moe_intermediate_size"]
        return SparseMoE(config, hf["moe_num_experts"], hf["moe_k"], inter, normalize=True, quant_config=quant_config,
                         prefix=prefix, norm_min=hf.get("moe_norm_min", 1e-12),
                         correction_bias=hf.get("moe_use_aux_free", True),  # False: no moe_statics
                         shared_intermediate_size=inter * hf.get("moe_num_shared_experts", 0))
