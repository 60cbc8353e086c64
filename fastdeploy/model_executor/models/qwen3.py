"""Qwen3 (transformers' Qwen3ForCausalLM): Llama with a per-head RMSNorm of q and k over head_dim
before RoPE (`q_norm`, `k_norm`); biases only if `attention_bias`."""
from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.models.causal_lm import CausalLM, with_flags


class Qwen3ForCausalLM(CausalLM):
    @classmethod
    def adapt_config(cls, config: ModelConfig) -> ModelConfig:
        return with_flags(config, qk_norm=True, qkv_bias=config.attention_bias, o_bias=config.attention_bias)
