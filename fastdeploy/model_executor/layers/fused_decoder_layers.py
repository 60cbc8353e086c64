"""Runs of consecutive fusable decoder layers in one call of the compiled `fd_decoder_layers` op.

custom_ops/cpu_ops/decoder_layer.cc runs fused add+RMSNorm, qkv (+ bias), the per-head q/k RMSNorm
(Qwen3), RoPE, append_attention, o (+ bias), add+RMSNorm, and the MLP: gate_up (+ bias), SwiGLU and
down (+ bias), or a sparse MoE (moe.cc: router, top-k experts, shared experts) for each layer of the
run through the same host functions as the single ops, each weight as GGUF blocks, packed
bf16/wint8/wint4 or dense float32 (the linear method's `operand`): bit-identical to the
layer-by-layer path, without its Python and ~12 us of dispatch per op (nine to fourteen per layer).

`plan_layer_runs` is the one place that decides, at build, which layers go through the op: the
fusable ones (DecoderLayer.fusable: a dense or sparse-MoE SwiGLU MLP and 1-D RoPE, so every layer of
Llama, Qwen2, Qwen3, ERNIE-4.5, Qwen3-MoE and ERNIE-4.5-MoE), in maximal consecutive runs, when the
model's attention backend is the compiled one, the op is built and the model is not tensor-parallel
(`fuse`): the op has no all-reduce between o_proj and the residual add, nor after down_proj, so under
tensor parallelism every layer runs layer by layer (splitting the op at each all-reduce is not done
yet). The plan is a list of callables with DecoderLayer.forward's signature, which the model calls
in order.
"""
from typing import Callable

import paddle

from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.append_attention import AppendAttentionBackend
from fastdeploy.model_executor.layers.moe import SparseMoE
from fastdeploy.model_executor.ops import compiled_op


class FusedDecoderLayers:
    """DecoderLayer.forward of consecutive fusable layers (with contiguous layer indices) in one op call.

    A bias, q/k norm weight, router or shared expert a layer lacks goes to the op as a zero-size tensor
    (type 0); a MoE layer's experts go in flat lists (SparseMoE.operands)."""

    def __init__(self, layers: list, op: Callable):
        self.op = op
        first = layers[0].self_attn
        self.caches = slice(first.layer_index, first.layer_index + len(layers))
        self.input_norms = [layer.input_layernorm.weight for layer in layers]
        self.post_norms = [layer.post_attention_layernorm.weight for layer in layers]
        absent = paddle.zeros([0], "float32")
        self.absent = absent
        self.linears = [(layer.self_attn.qkv_proj, layer.self_attn.o_proj) + _mlp_linears(layer.mlp)
                        for layer in layers]  # a MoE layer's gate_up / down: its shared experts', or None
        self.biases = [[absent if group[i] is None or group[i].bias is None else group[i].bias
                        for group in self.linears] for i in range(4)]  # [qkv, o, gate_up, down] bias lists
        self.moes = [layer.mlp if isinstance(layer.mlp, SparseMoE) else None for layer in layers]
        self.mlp_intermediate = [layer.mlp.intermediate_size if moe is None else
                                 (moe.shared_experts.intermediate_size if moe.shared_experts is not None else 0)
                                 for layer, moe in zip(layers, self.moes)]
        self.moe_attrs = _moe_attrs([moe for moe in self.moes if moe is not None])
        self._moe_operands = None
        attns = [layer.self_attn for layer in layers]
        self.q_norms = [absent if a.q_norm is None else a.q_norm.weight for a in attns]
        self.k_norms = [absent if a.k_norm is None else a.k_norm.weight for a in attns]
        eps = {norm.eps for layer in layers for norm in (layer.input_layernorm, layer.post_attention_layernorm,
                                                         layer.self_attn.q_norm, layer.self_attn.k_norm)
               if norm is not None}
        if len(eps) != 1:
            raise ValueError(f"fd_decoder_layers takes one RMSNorm eps for all its norms, these layers have {eps}")
        self.rope = first.rotary_emb
        self.shape = (first.num_heads, first.num_kv_heads, first.head_dim, eps.pop(), first.attn.scale)
        self._cache_source, self._keys, self._values = None, [], []
        self._operand_rows, self._operands = None, None

    def __call__(self, positions: paddle.Tensor, hidden: paddle.Tensor, residual, forward_meta: ForwardMeta):
        """Same arguments and results as DecoderLayer.forward, [n, hidden] each."""
        rows = hidden.shape[0]
        if residual is None:  # first layer: hidden + 0 is hidden exactly
            residual = paddle.zeros_like(hidden)
        if rows != self._operand_rows:  # steady decode keeps its batch size: ~0.2 ms of Python saved per step
            self._operands, self._operand_rows = self._gather_operands(rows), rows
        weights, qtypes = self._operands
        if forward_meta.caches is not self._cache_source:  # the runner hands the same list every step
            caches = forward_meta.caches[self.caches]
            self._keys, self._values = [c.key_tensor for c in caches], [c.value_tensor for c in caches]
            self._cache_source = forward_meta.caches
        if self._moe_operands is None:  # after loading: the experts' weights as their methods hold them
            self._moe_operands = self._gather_moe_operands()
        routers, correction_biases, gate_ups, downs, expert_qtypes, experts_per_layer = self._moe_operands
        attn, biases = forward_meta.attn_metadata, self.biases
        return self.op(hidden, residual, self.input_norms, weights[0], biases[0], self.q_norms, self.k_norms,
                       weights[1], biases[1], self.post_norms, weights[2], biases[2], weights[3], biases[3],
                       positions, self.rope.cos, self.rope.sin_signed, self._keys, self._values,
                       attn.slot_mapping, attn.cu_seqlens_q, attn.seq_lens_decoder, attn.block_tables,
                       routers, correction_biases, gate_ups, downs, qtypes, self.mlp_intermediate,
                       experts_per_layer, expert_qtypes, *self.shape, *self.moe_attrs)

    def _gather_operands(self, rows: int) -> tuple[list[list], list[int]]:
        """([qkv, o, gate_up, down] weight lists, type id per weight) for `rows` rows of x; a linear
        method's operand depends only on the row count, so the result is kept for the next call."""
        weights, qtypes = [[], [], [], []], []
        for group in self.linears:
            for i, linear in enumerate(group):
                tensor, qtype = (self.absent, 0) if linear is None else linear.method.operand(linear, rows)
                weights[i].append(tensor)
                qtypes.append(qtype)
        return weights, qtypes

    def _gather_moe_operands(self) -> tuple:
        """(routers, correction biases: one per layer, zero-size for dense layers or none; every MoE
        layer's experts' gate_up and down weights and their type ids, flat in layer order; experts per
        layer, 0 for dense layers). A run without MoE layers passes a zero-size placeholder expert and
        two type ids (Paddle's op inputs and attributes are not empty lists), which no layer reads."""
        routers, biases, gate_ups, downs, qtypes, counts = [], [], [], [], [], []
        for moe in self.moes:
            if moe is None:
                routers.append(self.absent)
                biases.append(self.absent)
                counts.append(0)
                continue
            o = moe.operands()
            routers.append(o["router"])
            biases.append(o["correction_bias"])
            gate_ups += o["gate_ups"]
            downs += o["downs"]
            qtypes += o["qtypes"]
            counts.append(len(o["gate_ups"]))
        return routers, biases, gate_ups or [self.absent], downs or [self.absent], qtypes or [0, 0], counts


def _mlp_linears(mlp) -> tuple:
    """(gate_up, down) of a dense MLP, or of a MoE layer's shared experts ((None, None) without them)."""
    if isinstance(mlp, SparseMoE):
        mlp = mlp.shared_experts
    return (None, None) if mlp is None else (mlp.gate_up_proj, mlp.down_proj)


def _moe_attrs(moes: list) -> tuple:
    """(top_k, expert intermediate size, normalize, norm_min) the op takes once for all MoE layers of a
    run: these layers must agree on them (a ValueError otherwise); zeros for a run without MoE."""
    attrs = {(m.top_k, m.intermediate_size, m.normalize, float(m.norm_min)) for m in moes}
    if len(attrs) > 1:
        raise ValueError(f"fd_decoder_layers takes one MoE setting (top_k, intermediate size, normalize, "
                         f"norm_min) for all its MoE layers, these layers have {sorted(attrs)}")
    return attrs.pop() if attrs else (0, 0, False, 0.0)


def consecutive_runs(flags: list[bool]) -> list[tuple[int, int, bool]]:
    """Maximal runs [start, end) of consecutive equal flags, in order."""
    runs = []
    for i, flag in enumerate(flags):
        if runs and runs[-1][2] == flag:
            runs[-1] = (runs[-1][0], i + 1, flag)
        else:
            runs.append((i, i + 1, flag))
    return runs


def plan_layer_runs(layers: list, attn_backend, fuse: bool = True) -> list:
    """Callables covering `layers` in order: a FusedDecoderLayers for each run of fusable layers when
    `fuse` and the op can run them, each other layer itself."""
    op = compiled_op("fd_decoder_layers") if fuse and isinstance(attn_backend, AppendAttentionBackend) else None
    plan = []
    for start, end, fusable in consecutive_runs([layer.fusable for layer in layers]):
        if fusable and op is not None:
            plan.append(FusedDecoderLayers(list(layers[start:end]), op))
        else:
            plan.extend(layers[start:end])
    return plan
