"""Sparse mixture-of-experts MLP (Shazeer et al. 2017; Qwen3-MoE, ERNIE-4.5-MoE as in transformers).

Routing, per token: router logits = x . W_gate (float32) -> softmax over experts = p. The top_k
experts are chosen by p + e_score_correction_bias (ERNIE's `moe_statics`; zero for Qwen3), and
weighted by their p (the bias only chooses). Weights are renormalised to sum 1 when
`normalize` (Qwen3's norm_topk_prob; ERNIE always, dividing by max(sum, norm_min)).
Output = sum over chosen experts of weight x expert(x) (SwiGLU experts) + shared experts' MLP(x).

Parameters (names relative to the layer, as the checkpoint's after packing gate/up): mlp.gate.weight
(the router, [hidden, experts], always dense float32), mlp.moe_statics.e_score_correction_bias
[1, experts] (ERNIE), mlp.experts.{e}.gate_up_proj / down_proj (a DenseMLP per expert: shards of
gate_proj and up_proj), mlp.shared_experts.* (ERNIE). Each expert runs once per step on the tokens
routed to it. `forward` receives the tokens' modality (`token_type_ids`, ForwardMeta) so that a
multimodal MoE can route on it; the text models here ignore it.

Where the ops are built, `forward` is the compiled `fd_moe_mlp` (custom_ops/cpu_ops/moe.cc): the same
routing and expert loop in C++, each expert's linears through its own linear method's weights
(`operands`), one op call instead of ~10 Paddle calls per active expert; `fd_decoder_layers` runs the
same host function for MoE layers it fuses, so the two agree bit for bit. `select_experts` and
`run_experts` (numpy, Paddle) are the fallback and the reference its tests check.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np
import paddle

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.linear import Linear, QuantConfig, UnquantizedLinearMethod
from fastdeploy.model_executor.layers.mlp import DenseMLP
from fastdeploy.model_executor.layers.parameters import empty_parameter
from fastdeploy.model_executor.ops import compiled_op


@dataclass
class Routing:
    experts: np.ndarray  # [n, top_k] chosen expert ids
    weights: np.ndarray  # [n, top_k] float32 mixing weights


class CorrectionBias(paddle.nn.Layer):
    """ERNIE's `moe_statics`: e_score_correction_bias [1, experts], added to p to choose experts."""

    def __init__(self, num_experts: int):
        super().__init__()
        self.e_score_correction_bias = empty_parameter([1, num_experts])


class SparseMoE(paddle.nn.Layer):
    def __init__(self, config: ModelConfig, num_experts: int, top_k: int, intermediate_size: int,
                 normalize: bool, quant_config: Optional[QuantConfig], prefix: str, norm_min: float = 0.0,
                 correction_bias: bool = False, shared_intermediate_size: int = 0):
        super().__init__()
        hidden = config.hidden_size
        self.num_experts, self.top_k = num_experts, top_k
        self.normalize, self.norm_min = normalize, norm_min
        self.gate = Linear(hidden, {None: num_experts}, False, UnquantizedLinearMethod())  # router: float32
        self.moe_statics = CorrectionBias(num_experts) if correction_bias else None
        self.experts = paddle.nn.LayerList([DenseMLP(hidden, intermediate_size, False, quant_config,
                                                     f"{prefix}.experts.{e}") for e in range(num_experts)])
        self.shared_experts = (DenseMLP(hidden, shared_intermediate_size, config.mlp_bias, quant_config,
                                        f"{prefix}.shared_experts") if shared_intermediate_size else None)
        self.intermediate_size = intermediate_size
        self._op = compiled_op("fd_moe_mlp")
        self._operands = None

    def operands(self) -> dict:
        """What fd_moe_mlp and fd_decoder_layers take for this layer, gathered once (after loading):
        router [hidden, E], correction bias (zero-size: none), the experts' gate_up and down weights and
        their type ids (the linear method's operand for one row: GGUF experts stay in blocks), and the
        shared experts' (zero-size weights, type 0, when there are none)."""
        if self._operands is None:
            absent = paddle.zeros([0], "float32")
            gate_ups, downs, qtypes = [], [], []
            for expert in self.experts:
                for linear, weights in ((expert.gate_up_proj, gate_ups), (expert.down_proj, downs)):
                    tensor, qtype = linear.method.operand(linear, 1)
                    weights.append(tensor)
                    qtypes.append(qtype)
            shared = self.shared_experts
            shared_linears = (shared.gate_up_proj, shared.down_proj) if shared is not None else ()
            shared_operands = [linear.method.operand(linear, 1) for linear in shared_linears] or [(absent, 0)] * 2
            self._operands = dict(
                router=self.gate.weight,
                correction_bias=absent if self.moe_statics is None else self.moe_statics.e_score_correction_bias,
                gate_ups=gate_ups, downs=downs, qtypes=qtypes,
                shared=[t for t, _ in shared_operands], shared_qtypes=[q for _, q in shared_operands],
                shared_biases=[absent if linear.bias is None else linear.bias for linear in shared_linears] or [absent] * 2,
                shared_intermediate=shared.intermediate_size if shared is not None else 0)
        return self._operands

    def route(self, x: paddle.Tensor) -> Routing:
        """Chosen experts and weights for x [n, hidden]."""
        bias = None if self.moe_statics is None else np.from_dlpack(self.moe_statics.e_score_correction_bias)[0]
        return select_experts(np.from_dlpack(self.gate(x)), self.top_k, self.normalize, self.norm_min, bias)

    def forward(self, x: paddle.Tensor, token_type_ids: Optional[paddle.Tensor] = None) -> paddle.Tensor:
        """x: [n, hidden] -> [n, hidden]. token_type_ids [n] (0 text, 1 image, 2 video) or None: the
        tokens' modality, for routers that depend on it; these text routers do not read it."""
        if self._op is not None:
            o = self.operands()
            return self._op(x, o["router"], o["correction_bias"], o["gate_ups"], o["downs"], *o["shared"],
                            *o["shared_biases"], o["qtypes"], o["shared_qtypes"], self.top_k, self.intermediate_size,
                            o["shared_intermediate"], self.normalize, self.norm_min)
        result = as_paddle(run_experts(x, self.route(x), self.experts))
        return result + self.shared_experts(x) if self.shared_experts is not None else result


def select_experts(logits: np.ndarray, top_k: int, normalize: bool, norm_min: float = 0.0,
                   correction_bias: Optional[np.ndarray] = None) -> Routing:
    """Routing of n tokens from router logits [n, E] (float32 math): p = softmax(logits); the top_k
    experts by p + correction_bias [E] (None: by p), ties to the lower id as torch.topk; weights p
    of the chosen, divided by max(sum, norm_min) when `normalize`."""
    logits = logits.astype(np.float32)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    scores = probs if correction_bias is None else probs + correction_bias
    experts = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(probs, experts, axis=1)
    if normalize:
        weights = weights / np.maximum(weights.sum(axis=1, keepdims=True), norm_min)
    return Routing(experts, weights.astype(np.float32))


def run_experts(x: paddle.Tensor, routing: Routing, experts) -> np.ndarray:
    """sum over each token's chosen experts of weight x experts[e](x) -> [n, hidden] float32 numpy.
    x: [n, hidden]; experts: indexable by the ids in routing.experts. Each expert runs once, on the
    tokens routed to it."""
    out = np.zeros(x.shape, np.float32)
    for e in np.unique(routing.experts):
        tokens, slot = np.nonzero(routing.experts == e)
        y = experts[int(e)](paddle.gather(x, as_paddle(tokens)))  # [tokens, hidden]
        np.add.at(out, tokens, np.from_dlpack(y) * routing.weights[tokens, slot, None])
    return out
