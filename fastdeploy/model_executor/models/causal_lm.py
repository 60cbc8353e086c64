"""A decoder-only causal LM over the paged KV cache: embedding -> decoder layers -> RMSNorm -> lm_head.

Parameters are allocated uninitialised (`paddle.empty`): loading fills every one or raises for the
missing ones. Model files subclass it with what is particular to them: the layers they build (`make_mlp`), the
config flags they imply (`adapt_config`), and any reordering of checkpoint tensors
(`transform_weight`). Loading takes Hugging Face names and [out, in] arrays, one tensor at a time.
Logits are computed only at `ForwardMeta.logits_indices`.
"""
import dataclasses

import numpy as np
import paddle

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.attention import AppendAttentionInputs, PaddleAttentionBackend
from fastdeploy.model_executor.layers.decoder_layer import DecoderLayer, DenseMLP, fused_decoder_layers
from fastdeploy.model_executor.layers.linear import LinearWeight, copy_transposed
from fastdeploy.model_executor.ops.normalization import fused_add_rms_norm
from fastdeploy.model_executor.layers.rotary_embedding import RotaryEmbedding
from fastdeploy.model_executor.model_loader.quantized import QuantizedTensor


class CausalLM:
    # checkpoint tensors every model ignores on purpose
    IGNORED_WEIGHTS = ("rotary_emb.inv_freq",)

    @classmethod
    def adapt_config(cls, config: ModelConfig) -> ModelConfig:
        """The config with the flags this architecture implies (none by default)."""
        return config

    def __init__(self, config: ModelConfig, block_size: int, max_model_len: int):
        self.config = config = self.adapt_config(config)
        self.layers = [DecoderLayer(config, self.make_mlp(config, i)) for i in range(config.num_hidden_layers)]
        self.embed_tokens = paddle.empty([config.vocab_size, config.hidden_size])
        self.norm = paddle.empty([config.hidden_size])
        # lm_head kept [hidden, vocab] (a transposed copy even when tied: 25% faster GEMM on CPU), or as
        # the embedding's GGUF blocks
        self.lm_head = LinearWeight(config.hidden_size, config.vocab_size)
        self.lm_head_bias = paddle.empty([config.vocab_size]) if config.lm_head_bias else None
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta, max_model_len, config.rope_scaling)
        self.attention = PaddleAttentionBackend(
            config.num_attention_heads, config.num_key_value_heads, config.head_dim, block_size
        )
        self.runs = layer_runs(self.layers)

    def make_mlp(self, config: ModelConfig, layer_index: int):
        return DenseMLP(config, config.intermediate_size)

    def forward(self, meta: ForwardMeta, kv_caches: list) -> paddle.Tensor:
        """Logits [num_sampled, vocab] at meta.logits_indices; writes this step's K/V into kv_caches."""
        attn_meta = self.attention.init_attention_metadata(meta)
        hidden, residual = paddle.nn.functional.embedding(meta.input_ids, self.embed_tokens), None  # [n, hidden]
        fused = isinstance(attn_meta, AppendAttentionInputs)  # the compiled attention op runs this step
        for start, end, fusable in self.runs:
            if fusable and fused:
                hidden, residual = fused_decoder_layers(self.layers[start:end], hidden, residual, self.rope,
                                                        meta.positions, self.attention, kv_caches[start:end],
                                                        attn_meta)
                continue
            for layer, kv_cache in zip(self.layers[start:end], kv_caches[start:end]):
                hidden, residual = layer.forward(hidden, residual, self.rope, meta.positions, self.attention,
                                                 kv_cache, attn_meta)
        rows = meta.logits_indices  # [num_sampled]
        hidden, _ = fused_add_rms_norm(paddle.gather(hidden, rows), paddle.gather(residual, rows), self.norm,
                                       self.config.rms_norm_eps)
        logits = self.lm_head(hidden)
        return logits if self.lm_head_bias is None else logits + self.lm_head_bias

    # ---- weight loading -------------------------------------------------------------------
    def transform_weight(self, name: str, array: np.ndarray) -> np.ndarray:
        """A checkpoint tensor as this model stores it (identity by default)."""
        return array

    def _targets(self, name: str):
        """(tensor, column range or None, transpose?) for a Hugging Face parameter name, or None."""
        top = {"model.embed_tokens.weight": (self.embed_tokens, None, False),
               "model.norm.weight": (self.norm, None, False),
               "lm_head.weight": (self.lm_head, None, True)}
        if self.lm_head_bias is not None:
            top["lm_head.bias"] = (self.lm_head_bias, None, False)
        if name in top:
            return top[name]
        parts = name.split(".")
        if parts[:2] != ["model", "layers"] or len(parts) < 5 or not parts[2].isdigit():
            return None
        index = int(parts[2])
        if index >= len(self.layers):
            return None
        spec = self.layers[index].hf_weight_table().get(".".join(parts[3:]))
        if spec is None:
            return None
        weights, key, cols, transpose = spec
        return weights[key], cols, transpose

    def load_weights(self, weights) -> None:
        """Copy (HF name, float32 array or QuantizedTensor [out, in]) pairs into the model, one at a time.

        Raises ValueError naming the tensor for an unknown name, a wrong shape, or a missing tensor.
        """
        loaded = set()
        for name, array in weights:
            if name.endswith(self.IGNORED_WEIGHTS):
                continue
            target = self._targets(name)
            if target is None:
                raise ValueError(f"checkpoint tensor {name!r} is not a parameter of {self.config.architecture}")
            tensor, cols, transpose = target
            if isinstance(tensor, LinearWeight):
                self._load_linear(name, tensor, cols, array)
                loaded.add(name)
                continue
            original = array
            if isinstance(array, QuantizedTensor):
                array = array.dequantize()
            view = np.from_dlpack(tensor)  # shares memory with the Paddle tensor
            if cols is not None:
                view = view[..., cols[0] : cols[1]]
            expected = view.T.shape if transpose else view.shape
            if tuple(array.shape) != tuple(expected):
                raise ValueError(f"checkpoint tensor {name!r} has shape {list(array.shape)}, expected {list(expected)}")
            source = self.transform_weight(name, array)
            if transpose:
                copy_transposed(view, source)
            else:
                view[...] = source
            loaded.add(name)
            if name == "model.embed_tokens.weight" and self.config.tie_word_embeddings:
                self._load_linear("lm_head.weight", self.lm_head, None, original)
                loaded.add("lm_head.weight")
        missing = sorted(set(self.expected_weight_names()) - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensor(s) of the model, e.g. {missing[:5]}")

    def _load_linear(self, name: str, weight: LinearWeight, cols, array) -> None:
        try:
            weight.load(cols, self.transform_weight(name, array))
        except ValueError as e:
            raise ValueError(f"checkpoint tensor {name!r} {e}") from None

    def expected_weight_names(self) -> list[str]:
        names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
        if self.lm_head_bias is not None:
            names.append("lm_head.bias")
        for i, layer in enumerate(self.layers):
            names += [f"model.layers.{i}.{key}" for key in layer.hf_weight_table()]
        return names



def with_flags(config: ModelConfig, **flags) -> ModelConfig:
    return dataclasses.replace(config, **flags)


def layer_runs(layers: list) -> list[tuple[int, int, bool]]:
    """Maximal runs [start, end) of consecutive layers with the same `fusable`, in order."""
    runs = []
    for i, layer in enumerate(layers):
        if runs and runs[-1][2] == layer.fusable:
            runs[-1] = (runs[-1][0], i + 1, layer.fusable)
        else:
            runs.append((i, i + 1, layer.fusable))
    return runs
