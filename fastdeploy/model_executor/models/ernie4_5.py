"""ERNIE-4.5 dense (Baidu 2025; transformers' Ernie4_5ForCausalLM, e.g. ERNIE-4.5-0.3B).

Llama's layer with two particulars:
- RoPE rotates interleaved pairs (dims 2i, 2i+1) where Llama rotates halves (i, i + head_dim/2).
  Attention scores only see q.k, which is unchanged when q and k have their head dims permuted
  alike, so the q_proj/k_proj rows (and biases) of each head are reordered at load time, evens
  first then odds, and the rotate-half RoPE then computes exactly the interleaved rotation.
- `use_bias` puts biases on every linear layer (q, k, v, o and the MLP).
"""
import numpy as np

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.models.causal_lm import CausalLM, with_flags
from fastdeploy.model_executor.model_loader.quantized import QuantizedTensor

ROTATED = (".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.q_proj.bias", ".self_attn.k_proj.bias")


def interleaved_to_halves(array: np.ndarray, head_dim: int) -> np.ndarray:
    """Rows [heads * head_dim, ...] reordered within each head: dims 0, 2, 4, ... then 1, 3, 5, ..."""
    order = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    heads = array.shape[0] // head_dim
    return array.reshape(heads, head_dim, *array.shape[1:])[:, order].reshape(array.shape)


class Ernie4_5ForCausalLM(CausalLM):
    @classmethod
    def adapt_config(cls, config: ModelConfig) -> ModelConfig:
        return with_flags(config, qkv_bias=config.use_bias, o_bias=config.use_bias, mlp_bias=config.use_bias)

    def transform_weight(self, name: str, array):
        if not name.endswith(ROTATED):
            return array
        if isinstance(array, QuantizedTensor):  # a GGUF matrix: its rows of blocks reordered alike
            return QuantizedTensor(interleaved_to_halves(array.blocks, self.config.head_dim), array.qtype,
                                   array.in_features)
        return interleaved_to_halves(array, self.config.head_dim)
