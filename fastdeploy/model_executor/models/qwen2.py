"""Qwen2 (transformers' Qwen2ForCausalLM): Llama with biases on the q, k and v projections
(none on o_proj or the MLP)."""
from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.models.causal_lm import CausalLM, with_flags


class Qwen2ForCausalLM(CausalLM):
    @classmethod
    def adapt_config(cls, config: ModelConfig) -> ModelConfig:
        return with_flags(config, qkv_bias=True, o_bias=False)
