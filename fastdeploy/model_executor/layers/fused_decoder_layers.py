"""Runs of consecutive fusable decoder layers in one call of the compiled `fd_decoder_layers` op.

custom_ops/cpu_ops/decoder_layer.cc runs fused add+RMSNorm, qkv (+ bias), the per-head q/k RMSNorm
(Qwen3), RoPE, append_attention, o (+ bias), add+RMSNorm, gate_up (+ bias), SwiGLU and down (+ bias)
for each layer of the run through the same host functions as the single ops, each weight as GGUF
blocks, packed bf16/wint8/wint4 or dense float32 (the linear method's `operand`): bit-identical to
the layer-by-layer path, without its Python and ~12 us of dispatch per op (nine to fourteen per layer).

`plan_layer_runs` is the one place that decides, at build, which layers go through the op: the
fusable ones (DecoderLayer.fusable: a dense MLP and 1-D RoPE, so every layer of Llama, Qwen2, Qwen3
and ERNIE-4.5 dense, and the dense layers of the MoE models), in maximal consecutive runs, when the
model's attention backend is the compiled one, the op is built and the model is not tensor-parallel
(`fuse`): the op has no all-reduce between o_proj and the residual add, nor after down_proj, so under
tensor parallelism every layer runs layer by layer (splitting the op at each all-reduce is not done
yet). MoE layers run layer by layer. The plan is a list of callables with DecoderLayer.forward's
signature, which the model calls in order.
"""
from typing import Callable

import paddle

from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.append_attention import AppendAttentionBackend
from fastdeploy.model_executor.ops import compiled_op


class FusedDecoderLayers:
    """DecoderLayer.forward of consecutive fusable layers (with contiguous layer indices) in one op call.

    A bias or q/k norm weight a layer lacks goes to the op as a zero-size tensor."""

    def __init__(self, layers: list, op: Callable):
        self.op = op
        first = layers[0].self_attn
        self.caches = slice(first.layer_index, first.layer_index + len(layers))
        self.input_norms = [layer.input_layernorm.weight for layer in layers]
        self.post_norms = [layer.post_attention_layernorm.weight for layer in layers]
        self.linears = [(layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
                        for layer in layers]
        absent = paddle.zeros([0], "float32")
        self.biases = [[absent if group[i].bias is None else group[i].bias for group in self.linears]
                       for i in range(4)]  # [qkv, o, gate_up, down] bias lists
        attns = [layer.self_attn for layer in layers]
        self.q_norms = [absent if a.q_norm is None else a.q_norm.weight for a in attns]
        self.k_norms = [absent if a.k_norm is None else a.k_norm.weight for a in attns]
        eps = {norm.eps for layer in layers for norm in (layer.input_layernorm, layer.post_attention_layernorm,
                                                         layer.self_attn.q_norm, layer.self_attn.k_norm)
               if norm is not None}
        if len(eps) != 1:
            raise ValueError(f"fd_decoder_layers takes one RMSNorm eps for all its norms, these layers have {eps}")
        self.rope = first.rotary_emb
        self.shape = (first.num_heads, first.num_kv_heads, first.head_dim, layers[0].mlp.intermediate_size,
                      eps.pop(), first.attn.scale)
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
        attn, biases = forward_meta.attn_metadata, self.biases
        return self.op(hidden, residual, self.input_norms, weights[0], biases[0], self.q_norms, self.k_norms,
                       weights[1], biases[1], self.post_norms, weights[2], biases[2], weights[3], biases[3],
                       positions, self.rope.cos, self.rope.sin_signed, self._keys, self._values,
                       attn.slot_mapping, attn.cu_seqlens_q, attn.seq_lens_decoder, attn.block_tables, qtypes,
                       *self.shape)

    def _gather_operands(self, rows: int) -> tuple[list[list], list[int]]:
        """([qkv, o, gate_up, down] weight lists, type id per weight) for `rows` rows of x; a linear
        method's operand depends only on the row count, so the result is kept for the next call."""
        weights, qtypes = [[], [], [], []], []
        for group in self.linears:
            for i, linear in enumerate(group):
                tensor, qtype = linear.method.operand(linear, rows)
                weights[i].append(tensor)
                qtypes.append(qtype)
        return weights, qtypes


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
