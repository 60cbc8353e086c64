"""Llama (Touvron et al. 2023; transformers' LlamaForCausalLM): the plain decoder of causal_lm.py.
`attention_bias` in config.json adds biases to q/k/v and o_proj, `mlp_bias` to the MLP."""
from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.models.causal_lm import CausalLM, with_flags


class LlamaForCausalLM(CausalLM):
    @classmethod
    def adapt_config(cls, config: ModelConfig) -> ModelConfig:
        return with_flags(config, qkv_bias=config.attention_bias, o_bias=config.attention_bias)
