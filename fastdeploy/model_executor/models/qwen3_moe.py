"""Qwen3-MoE (transformers' Qwen3MoeForCausalLM): Qwen3's attention; the MLP of layer i is a sparse
MoE (softmax router, top `num_experts_per_tok`, renormalised if `norm_topk_prob`) unless i is in
`mlp_only_layers` or (i + 1) is not a multiple of `decoder_sparse_step`. The expert count is
`num_experts` (Qwen's configs) or `num_local_experts` (as transformers 5 saves it)."""
from typing import Optional

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.layers.linear import QuantConfig
from fastdeploy.model_executor.layers.mlp import DenseMLP
from fastdeploy.model_executor.layers.moe import SparseMoE
from fastdeploy.model_executor.models.qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(self, config: ModelConfig, layer_index: int, quant_config: Optional[QuantConfig], prefix: str):
        hf = config.hf_config
        num_experts = hf.get("num_experts") or hf.get("num_local_experts") or 0  # transformers 5 writes the latter
        sparse = (layer_index not in hf.get("mlp_only_layers", []) and num_experts > 0
                  and (layer_index + 1) % hf.get("decoder_sparse_step", 1) == 0)
        if not sparse:
            return DenseMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, quant_config, prefix)
        return SparseMoE(config, num_experts, hf["num_experts_per_tok"], hf["moe_intermediate_size"],
                         normalize=bool(hf.get("norm_topk_prob", False)), quant_config=quant_config, prefix=prefix)
