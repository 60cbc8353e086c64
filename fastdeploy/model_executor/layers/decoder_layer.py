"""The pre-norm transformer decoder layer shared by the dense models (Llama, Qwen2, Qwen3, ERNIE-4.5).

    h = h + o_proj(attention(rope(q_norm?(q)), rope(k_norm?(k)), v))   with q, k, v = qkv_proj(rms_norm(h))
    h = h + mlp(rms_norm(h))                                             mlp = down(swiglu(gate_up(x)))

Each residual add is fused into the norm after it (ops/normalization.py: fused_add_rms_norm), and RoPE
rotates q and k inside the fused qkv projection in place (ops/rotary_embedding.py).

Linear weights are `LinearWeight`s (layers/linear.py: dense [in, out], Paddle's layout, or GGUF
blocks) and fused: qkv [hidden, (heads + 2 kv_heads) * head_dim], gate_up [hidden, 2 * intermediate]. Optional parts follow ModelConfig: biases on q/k/v (`qkv_bias`,
Qwen2), on o_proj (`o_bias`), on the MLP (`mlp_bias`), and per-head RMSNorm of q and k before RoPE
(`qk_norm`, Qwen3).

Layers without those optional parts (`fusable`), running on the compiled attention op, go through
`fused_decoder_layers`: a run of them in one call of the compiled `fd_decoder_layers` op
(custom_ops/cpu_ops/decoder_layer.cc), the same kernels without the Python and Paddle dispatch
between them (nine op calls per layer, ~12 us each).

`hf_weight_table` maps a Hugging Face parameter name inside a layer to where it goes (the MLP's
names are given by its `mlp` object: DenseMLP here, SparseMoE in moe.py).
"""
import paddle

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.layers.attention import AppendAttentionInputs
from fastdeploy.model_executor.ops import compiled_op
from fastdeploy.model_executor.ops.activation import silu_and_mul
from fastdeploy.model_executor.layers.linear import LinearWeight
from fastdeploy.model_executor.ops.normalization import fused_add_rms_norm, rms_norm
from fastdeploy.model_executor.ops.rotary_embedding import rotary_embedding_
from fastdeploy.model_executor.layers.rotary_embedding import RotaryEmbedding


class DenseMLP:
    """SwiGLU MLP: down(silu(gate(x)) * up(x)), gate and up fused."""

    def __init__(self, config: ModelConfig, intermediate_size: int, prefix: str = "mlp"):
        hidden = config.hidden_size
        self.prefix = prefix
        self.inter = intermediate_size
        self.weights = {"gate_up": LinearWeight(hidden, 2 * intermediate_size),
                        "down_proj": LinearWeight(intermediate_size, hidden)}
        if config.mlp_bias:
            self.weights["gate_up_bias"] = paddle.empty([2 * intermediate_size])
            self.weights["down_proj_bias"] = paddle.empty([hidden])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        # x: [n, hidden] -> [n, hidden]
        w = self.weights
        gate_up = w["gate_up"](x)
        if "gate_up_bias" in w:
            gate_up = gate_up + w["gate_up_bias"]
        out = w["down_proj"](silu_and_mul(gate_up))
        return out + w["down_proj_bias"] if "down_proj_bias" in w else out

    def hf_weight_table(self) -> dict:
        """HF name (inside the layer) -> (weights dict, key, column range or None, transpose?)."""
        p, i = self.prefix, self.inter
        table = {
            f"{p}.gate_proj.weight": ("gate_up", (0, i), True),
            f"{p}.up_proj.weight": ("gate_up", (i, 2 * i), True),
            f"{p}.down_proj.weight": ("down_proj", None, True),
        }
        if "gate_up_bias" in self.weights:
            table.update({f"{p}.gate_proj.bias": ("gate_up_bias", (0, i), False),
                          f"{p}.up_proj.bias": ("gate_up_bias", (i, 2 * i), False),
                          f"{p}.down_proj.bias": ("down_proj_bias", None, False)})
        return {name: (self.weights, *spec) for name, spec in table.items()}


class DecoderLayer:
    def __init__(self, config: ModelConfig, mlp):
        hidden, dim = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, dim
        self.q_size, self.kv_size = self.num_heads * dim, self.num_kv_heads * dim
        self.eps = config.rms_norm_eps
        self.mlp = mlp
        qkv = self.q_size + 2 * self.kv_size
        self.weights = {
            "input_layernorm": paddle.empty([hidden]),
            "qkv": LinearWeight(hidden, qkv),
            "o_proj": LinearWeight(self.q_size, hidden),
            "post_attention_layernorm": paddle.empty([hidden]),
        }
        if config.qkv_bias:
            self.weights["qkv_bias"] = paddle.empty([qkv])
        if config.o_bias:
            self.weights["o_proj_bias"] = paddle.empty([hidden])
        if config.qk_norm:
            self.weights["q_norm"] = paddle.empty([dim])
            self.weights["k_norm"] = paddle.empty([dim])
        # fused_decoder_layers can run it: a plain layer (no biases, no q/k norms, a dense SwiGLU MLP)
        plain = not (config.qkv_bias or config.o_bias or config.qk_norm or config.mlp_bias)
        self.fusable = plain and type(mlp) is DenseMLP and compiled_op("fd_decoder_layers") is not None

    def forward(self, hidden, residual, rope: RotaryEmbedding, positions, attention, kv_cache, attn_meta):
        """One layer with the residual stream carried separately (so each add fuses into the next norm).

        hidden: [n, hidden], the previous layer's MLP output (the embeddings for the first layer, with
        residual None); residual: [n, hidden] or None. Returns (this layer's MLP output, residual): the
        layer's true output is their sum, formed by the next layer's (or the final) fused add + norm.
        """
        w = self.weights
        if residual is None:
            residual, x = hidden, rms_norm(hidden, w["input_layernorm"], self.eps)
        else:
            x, residual = fused_add_rms_norm(hidden, residual, w["input_layernorm"], self.eps)
        qkv = w["qkv"](x)  # [n, q_size + 2 kv_size]
        if "qkv_bias" in w:
            qkv = qkv + w["qkv_bias"]
        if "q_norm" in w:
            qkv = self._qk_norm(qkv)
        rotary_embedding_(qkv, positions, rope.cos, rope.sin_signed, self.num_heads, self.num_kv_heads, self.head_dim)
        attn = w["o_proj"](attention.forward(qkv, kv_cache, attn_meta))
        if "o_proj_bias" in w:
            attn = attn + w["o_proj_bias"]
        x, residual = fused_add_rms_norm(attn, residual, w["post_attention_layernorm"], self.eps)
        return self.mlp.forward(x), residual

    def _qk_norm(self, qkv: paddle.Tensor) -> paddle.Tensor:
        """Per-head RMSNorm of q and k over head_dim (Qwen3); qkv [n, q_size + 2 kv_size] -> a new one."""
        n, w, dim = qkv.shape[0], self.weights, self.head_dim
        q = rms_norm(qkv[:, : self.q_size].reshape([n, self.num_heads, dim]), w["q_norm"], self.eps)
        k = rms_norm(qkv[:, self.q_size : self.q_size + self.kv_size].reshape([n, self.num_kv_heads, dim]),
                     w["k_norm"], self.eps)
        return paddle.concat([q.reshape([n, -1]), k.reshape([n, -1]), qkv[:, self.q_size + self.kv_size :]], axis=1)

    def hf_weight_table(self) -> dict:
        """HF name (inside the layer) -> (weights dict, key, column range or None, transpose?)."""
        q, kv = self.q_size, self.kv_size
        table = {
            "input_layernorm.weight": ("input_layernorm", None, False),
            "post_attention_layernorm.weight": ("post_attention_layernorm", None, False),
            "self_attn.q_proj.weight": ("qkv", (0, q), True),
            "self_attn.k_proj.weight": ("qkv", (q, q + kv), True),
            "self_attn.v_proj.weight": ("qkv", (q + kv, q + 2 * kv), True),
            "self_attn.o_proj.weight": ("o_proj", None, True),
        }
        if "qkv_bias" in self.weights:
            table.update({"self_attn.q_proj.bias": ("qkv_bias", (0, q), False),
                          "self_attn.k_proj.bias": ("qkv_bias", (q, q + kv), False),
                          "self_attn.v_proj.bias": ("qkv_bias", (q + kv, q + 2 * kv), False)})
        if "o_proj_bias" in self.weights:
            table["self_attn.o_proj.bias"] = ("o_proj_bias", None, False)
        if "q_norm" in self.weights:
            table.update({"self_attn.q_norm.weight": ("q_norm", None, False),
                          "self_attn.k_norm.weight": ("k_norm", None, False)})
        full = {name: (self.weights, *spec) for name, spec in table.items()}
        full.update(self.mlp.hf_weight_table())
        return full


def fused_decoder_layers(layers: list, hidden, residual, rope: RotaryEmbedding, positions, attention,
                         kv_caches: list, meta: AppendAttentionInputs):
    """`DecoderLayer.forward` of consecutive `fusable` layers in one `fd_decoder_layers` call.

    Same arguments as forward, with a KV cache per layer; returns (last layer's MLP output, residual),
    [n, hidden] each, equal to the layer-by-layer results (the same kernels in the same order).
    """
    rows = hidden.shape[0]
    if residual is None:  # first layer: hidden + 0 is hidden exactly
        residual = paddle.zeros_like(hidden)
    weights = [[], [], [], []]  # qkv, o, gate_up, down
    qtypes = []
    for layer in layers:
        w, mlp = layer.weights, layer.mlp.weights
        for i, linear in enumerate((w["qkv"], w["o_proj"], mlp["gate_up"], mlp["down_proj"])):
            tensor, qtype = linear.operand(rows)
            weights[i].append(tensor)
            qtypes.append(qtype)
    first = layers[0]
    return compiled_op("fd_decoder_layers")(
        hidden, residual, [layer.weights["input_layernorm"] for layer in layers], weights[0], weights[1],
        [layer.weights["post_attention_layernorm"] for layer in layers], weights[2], weights[3], positions,
        rope.cos, rope.sin_signed, [c.key_tensor for c in kv_caches], [c.value_tensor for c in kv_caches],
        meta.slot_mapping, meta.cu_seqlens_q, meta.seq_lens_decoder, meta.block_tables, qtypes, first.num_heads,
        first.num_kv_heads, first.head_dim, first.mlp.inter, first.eps, attention.scale,
    )
