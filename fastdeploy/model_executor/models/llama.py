"""Llama (Touvron et al. 2023; transformers' LlamaForCausalLM) for inference in Paddle, fp32.

Per layer: RMSNorm -> fused QKV projection -> RoPE on q, k -> paged attention (grouped-query:
`num_key_value_heads` KV heads serve `num_attention_heads` query heads) -> output projection ->
residual; RMSNorm -> fused gate/up projection -> SwiGLU -> down projection -> residual.
Weights are stored [in, out] (Paddle's layout) and fused: qkv [hidden, (heads + 2 kv_heads) * head_dim],
gate_up [hidden, 2 * intermediate]. Logits are computed only at `ForwardMeta.logits_indices`.
"""
import numpy as np
import paddle

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.activation import silu_and_mul
from fastdeploy.model_executor.layers.attention import PaddleAttentionBackend
from fastdeploy.model_executor.layers.normalization import rms_norm
from fastdeploy.model_executor.layers.rotary_embedding import RotaryEmbedding

# Checkpoint tensors the model ignores on purpose.
IGNORED_WEIGHTS = ("rotary_emb.inv_freq",)


class LlamaDecoderLayer:
    def __init__(self, config: ModelConfig):
        hidden, dim = config.hidden_size, config.head_dim
        self.q_size = config.num_attention_heads * dim
        self.kv_size = config.num_key_value_heads * dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = dim
        self.eps = config.rms_norm_eps
        qkv = self.q_size + 2 * self.kv_size
        self.weights = {
            "input_layernorm": paddle.zeros([hidden]),
            "qkv": paddle.zeros([hidden, qkv]),
            "o_proj": paddle.zeros([self.q_size, hidden]),
            "post_attention_layernorm": paddle.zeros([hidden]),
            "gate_up": paddle.zeros([hidden, 2 * config.intermediate_size]),
            "down_proj": paddle.zeros([config.intermediate_size, hidden]),
        }
        if config.attention_bias:
            self.weights["qkv_bias"] = paddle.zeros([qkv])
            self.weights["o_proj_bias"] = paddle.zeros([hidden])

    def forward(self, hidden, rope: RotaryEmbedding, cos, sin, attention, kv_cache, attn_meta):
        # hidden: [num_tokens, hidden]
        w = self.weights
        n = hidden.shape[0]
        x = rms_norm(hidden, w["input_layernorm"], self.eps)
        qkv = paddle.matmul(x, w["qkv"])  # [n, q_size + 2 kv_size]
        if "qkv_bias" in w:
            qkv = qkv + w["qkv_bias"]
        qk = qkv[:, : self.q_size + self.kv_size].reshape([n, self.num_heads + self.num_kv_heads, self.head_dim])
        qk = rope.apply(qk, cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]  # views, no copies
        v = qkv[:, self.q_size + self.kv_size :]  # [n, kv_size] view
        attn = attention.forward(q, k, v, kv_cache, attn_meta)  # [n, q_size]
        attn = paddle.matmul(attn, w["o_proj"])
        if "o_proj_bias" in w:
            attn = attn + w["o_proj_bias"]
        hidden = hidden + attn
        x = rms_norm(hidden, w["post_attention_layernorm"], self.eps)
        return hidden + paddle.matmul(silu_and_mul(paddle.matmul(x, w["gate_up"])), w["down_proj"])


class LlamaForCausalLM:
    def __init__(self, config: ModelConfig, block_size: int, max_model_len: int):
        self.config = config
        self.layers = [LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers)]
        self.embed_tokens = paddle.zeros([config.vocab_size, config.hidden_size])
        self.norm = paddle.zeros([config.hidden_size])
        # lm_head kept [hidden, vocab] (a transposed copy even when tied): 25% faster GEMM on CPU
        self.lm_head = paddle.zeros([config.hidden_size, config.vocab_size])
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta, max_model_len, config.rope_scaling)
        self.attention = PaddleAttentionBackend(
            config.num_attention_heads, config.num_key_value_heads, config.head_dim, block_size
        )

    def forward(self, meta: ForwardMeta, kv_caches: list) -> paddle.Tensor:
        """Logits [num_sampled, vocab] at meta.logits_indices; writes this step's K/V into kv_caches."""
        attn_meta = self.attention.init_attention_metadata(meta)
        cos, sin = self.rope.tables(meta.positions, self.config.num_attention_heads + self.config.num_key_value_heads)
        hidden = paddle.nn.functional.embedding(meta.input_ids, self.embed_tokens)  # [n, hidden]
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden = layer.forward(hidden, self.rope, cos, sin, self.attention, kv_cache, attn_meta)
        hidden = paddle.gather(hidden, meta.logits_indices)  # [num_sampled, hidden]
        hidden = rms_norm(hidden, self.norm, self.config.rms_norm_eps)
        return paddle.matmul(hidden, self.lm_head)

    # ---- weight loading -------------------------------------------------------------------
    def _targets(self, name: str):
        """(tensor, column slice or None, transpose?) for a Hugging Face parameter name."""
        c = self.config
        if name == "model.embed_tokens.weight":
            return self.embed_tokens, None, False
        if name == "model.norm.weight":
            return self.norm, None, False
        if name == "lm_head.weight":
            return self.lm_head, None, True
        parts = name.split(".")
        if parts[:2] != ["model", "layers"] or len(parts) < 5:
            return None
        layer = self.layers[int(parts[2])].weights
        key = ".".join(parts[3:])
        q, kv, inter = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size
        table = {
            "input_layernorm.weight": ("input_layernorm", None, False),
            "post_attention_layernorm.weight": ("post_attention_layernorm", None, False),
            "self_attn.q_proj.weight": ("qkv", (0, q), True),
            "self_attn.k_proj.weight": ("qkv", (q, q + kv), True),
            "self_attn.v_proj.weight": ("qkv", (q + kv, q + 2 * kv), True),
            "self_attn.q_proj.bias": ("qkv_bias", (0, q), False),
            "self_attn.k_proj.bias": ("qkv_bias", (q, q + kv), False),
            "self_attn.v_proj.bias": ("qkv_bias", (q + kv, q + 2 * kv), False),
            "self_attn.o_proj.weight": ("o_proj", None, True),
            "self_attn.o_proj.bias": ("o_proj_bias", None, False),
            "mlp.gate_proj.weight": ("gate_up", (0, inter), True),
            "mlp.up_proj.weight": ("gate_up", (inter, 2 * inter), True),
            "mlp.down_proj.weight": ("down_proj", None, True),
        }
        if key not in table or table[key][0] not in layer:
            return None
        target, cols, transpose = table[key]
        return layer[target], cols, transpose

    def load_weights(self, weights) -> None:
        """Copy (HF name, float32 array [out, in]) pairs into the model, one tensor at a time.

        Raises ValueError naming the tensor for an unknown name, a wrong shape, or a missing tensor.
        """
        loaded = set()
        for name, array in weights:
            if name.endswith(IGNORED_WEIGHTS):
                continue
            target = self._targets(name)
            if target is None:
                raise ValueError(f"checkpoint tensor {name!r} is not a parameter of {self.config.architecture}")
            tensor, cols, transpose = target
            view = np.from_dlpack(tensor)  # shares memory with the Paddle tensor
            if cols is not None:
                view = view[..., cols[0] : cols[1]]
            source = array.T if transpose else array
            if source.shape != view.shape:
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {list(array.shape)}, expected "
                    f"{list(view.T.shape if transpose else view.shape)}"
                )
            view[...] = source
            loaded.add(name)
            if name == "model.embed_tokens.weight" and self.config.tie_word_embeddings:
                np.from_dlpack(self.lm_head)[...] = array.T
                loaded.add("lm_head.weight")
        missing = sorted(set(self.expected_weight_names()) - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensor(s) of the model, e.g. {missing[:5]}")

    def expected_weight_names(self) -> list[str]:
        c = self.config
        names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
        per_layer = [
            "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
            "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
        ]
        if c.attention_bias:
            per_layer += ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.o_proj.bias"]
        for i in range(c.num_hidden_layers):
            names += [f"model.layers.{i}.{p}" for p in per_layer]
        return names
