"""The pre-norm transformer decoder layer shared by the zoo (Llama, Qwen2, Qwen3, ERNIE-4.5, their MoEs).

    h = h + o_proj(attention(rope(q_norm?(q)), rope(k_norm?(k)), v))   with q, k, v = qkv_proj(rms_norm(h))
    h = h + mlp(rms_norm(h))

Each residual add is fused into the norm after it (RMSNorm with a residual), and RoPE rotates q
and k inside the fused qkv projection in place. Parameters (names relative to the layer):
input_layernorm.weight, self_attn.qkv_proj.{weight,bias?} (shards q, k, v from the checkpoint's
q_proj/k_proj/v_proj), self_attn.o_proj.{weight,bias?}, self_attn.{q,k}_norm.weight (Qwen3),
post_attention_layernorm.weight, and the MLP's (layers/mlp.py DenseMLP, or layers/moe.py SparseMoE).
Optional parts follow ModelConfig: `qkv_bias`, `o_bias`, `mlp_bias`, `qk_norm`.

A layer with a dense or sparse-MoE MLP (layers/moe.py SparseMoE; biases and q/k norms or not) and 1-D
RoPE is `fusable`: layers/fused_decoder_layers.py may run it inside the compiled `fd_decoder_layers`
op instead of through `forward` (M-RoPE layers, the VL model's, always run through `forward`).

Under tensor parallelism each rank holds some heads and a slice of the MLP (distributed/sharding.py),
so o_proj and the MLP (dense or MoE, shared experts included) give partial sums: one all-reduce
after each completes them before the residual add (Megatron-LM's row-parallel output).
"""
from typing import Optional

import paddle

from fastdeploy.config import ModelConfig
from fastdeploy.distributed.parallel_state import get_tp_group
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.linear import Linear, QuantConfig, select_linear_method
from fastdeploy.model_executor.layers.mlp import DenseMLP
from fastdeploy.model_executor.layers.moe import SparseMoE
from fastdeploy.model_executor.layers.normalization import RMSNorm
from fastdeploy.model_executor.layers.rotary_embedding import RotaryEmbedding
from fastdeploy.model_executor.ops import compiled_op


class Attention(paddle.nn.Layer):
    """Self-attention over the paged KV cache of decoder layer `layer_index`.

    rope and attn_backend are shared by all layers and chosen by the model at build; they hold no
    parameters.
    """

    def __init__(self, config: ModelConfig, layer_index: int, rope: RotaryEmbedding, attn_backend,
                 quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        dim = config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, dim
        self.q_size, self.kv_size = self.num_heads * dim, self.num_kv_heads * dim
        self.layer_index = layer_index
        qkv_names = [f"{prefix}.{p}_proj.weight" for p in "qkv"]
        self.qkv_proj = Linear(config.hidden_size, {"q": self.q_size, "k": self.kv_size, "v": self.kv_size},
                               config.qkv_bias, select_linear_method(quant_config, qkv_names))
        self.o_proj = Linear(self.q_size, {None: config.hidden_size}, config.o_bias,
                             select_linear_method(quant_config, [f"{prefix}.o_proj.weight"]))
        self.q_norm = RMSNorm(dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(dim, config.rms_norm_eps) if config.qk_norm else None
        self._qk_norm_op = compiled_op("fd_qk_rms_norm") if config.qk_norm else None
        self.rotary_emb = rope
        self.attn = attn_backend

    def forward(self, positions: paddle.Tensor, x: paddle.Tensor, forward_meta: ForwardMeta) -> paddle.Tensor:
        # x: [n, hidden] normalised -> [n, hidden]; writes this step's K/V into the layer's cache
        qkv = self.qkv_proj(x)  # [n, q_size + 2 kv_size]
        if self.q_norm is not None:
            qkv = self._qk_norm(qkv)
        self.rotary_emb.rotate_(positions, qkv, self.num_heads, self.num_kv_heads)
        out = self.attn.forward(qkv, forward_meta.caches[self.layer_index], forward_meta.attn_metadata)
        return self.o_proj(out)  # [n, heads * head_dim] -> [n, hidden]

    def _qk_norm(self, qkv: paddle.Tensor) -> paddle.Tensor:
        """Per-head RMSNorm of q and k over head_dim (Qwen3); qkv [n, q_size + 2 kv_size] -> normed qkv:
        in place by the compiled `fd_qk_rms_norm` (the kernel fd_decoder_layers runs), else a new
        tensor through the q_norm/k_norm layers."""
        if self._qk_norm_op is not None:
            self._qk_norm_op(qkv, self.q_norm.weight, self.k_norm.weight, self.num_heads, self.num_kv_heads,
                             self.q_norm.eps)
            return qkv
        n, dim, q, kv = qkv.shape[0], self.head_dim, self.q_size, self.kv_size
        q_heads = self.q_norm(qkv[:, :q].reshape([n, self.num_heads, dim]))
        k_heads = self.k_norm(qkv[:, q : q + kv].reshape([n, self.num_kv_heads, dim]))
        return paddle.concat([q_heads.reshape([n, -1]), k_heads.reshape([n, -1]), qkv[:, q + kv :]], axis=1)


class DecoderLayer(paddle.nn.Layer):
    def __init__(self, config: ModelConfig, layer_index: int, rope: RotaryEmbedding, attn_backend,
                 mlp: paddle.nn.Layer, quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_index, rope, attn_backend, quant_config, f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp
        # the fused op runs dense and sparse-MoE SwiGLU MLPs and rotates with 1-D positions' tables: M-RoPE
        # layers and other MLPs are never fusable
        self.fusable = type(mlp) in (DenseMLP, SparseMoE) and type(rope) is RotaryEmbedding
        group = get_tp_group()
        self.all_reduce = group.all_reduce if group.size > 1 else _identity

    def forward(self, positions: paddle.Tensor, hidden: paddle.Tensor, residual: Optional[paddle.Tensor],
                forward_meta: ForwardMeta) -> tuple[paddle.Tensor, paddle.Tensor]:
        """One layer with the residual stream carried separately (so each add fuses into the next norm).

        hidden: [n, hidden], the previous layer's MLP output (the embeddings for the first layer, with
        residual None); residual: [n, hidden] or None. Returns (this layer's MLP output, residual): the
        layer's true output is their sum, formed by the next layer's (or the final) fused add + norm.
        """
        if residual is None:
            residual, x = hidden, self.input_layernorm(hidden)
        else:
            x, residual = self.input_layernorm(hidden, residual)
        x = self.all_reduce(self.self_attn(positions, x, forward_meta))
        x, residual = self.post_attention_layernorm(x, residual)
        return self.all_reduce(self.mlp(x, forward_meta.token_type_ids)), residual


def _identity(x: paddle.Tensor) -> paddle.Tensor:
    return x
