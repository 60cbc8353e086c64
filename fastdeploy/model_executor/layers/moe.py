"""Sparse mixture-of-experts MLP (Shazeer et al. 2017; Qwen3-MoE, ERNIE-4.5-MoE as in transformers).

Routing, per token: router logits = x . W_gate (float32) -> softmax over experts = p. The top_k
experts are chosen by p + e_score_correction_bias (ERNIE's `moe_statics`; zero for Qwen3), and
weighted by their p (the bias only chooses). Weights are renormalised to sum 1 when
`normalize` (Qwen3's norm_topk_prob; ERNIE always, dividing by max(sum, norm_min)).
Output = sum over chosen experts of weight x expert(x) (SwiGLU experts) + shared experts' MLP(x).

Experts are stored per expert, [in, out]: gate_up [hidden, 2 * moe_intermediate], down
[moe_intermediate, hidden]. Each expert runs once per step on the tokens routed to it.
"""
from dataclasses import dataclass

import numpy as np
import paddle

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.ops.activation import silu_and_mul
from fastdeploy.model_executor.layers.decoder_layer import DenseMLP


@dataclass
class Routing:
    experts: np.ndarray  # [n, top_k] chosen expert ids
    weights: np.ndarray  # [n, top_k] float32 mixing weights


class SparseMoE:
    def __init__(self, config: ModelConfig, num_experts: int, top_k: int, intermediate_size: int,
                 normalize: bool, norm_min: float = 0.0, correction_bias: bool = False,
                 shared_intermediate_size: int = 0):
        hidden = config.hidden_size
        self.num_experts, self.top_k, self.inter = num_experts, top_k, intermediate_size
        self.normalize, self.norm_min = normalize, norm_min
        self.weights = {"gate": paddle.empty([hidden, num_experts])}
        if correction_bias:
            self.weights["e_score_correction_bias"] = paddle.empty([1, num_experts])
        for e in range(num_experts):
            self.weights[f"gate_up.{e}"] = paddle.empty([hidden, 2 * intermediate_size])
            self.weights[f"down.{e}"] = paddle.empty([intermediate_size, hidden])
        self.shared = DenseMLP(config, shared_intermediate_size, "mlp.shared_experts") if shared_intermediate_size else None

    def route(self, x: paddle.Tensor) -> Routing:
        """Chosen experts and weights for x [n, hidden]."""
        logits = np.from_dlpack(paddle.matmul(x, self.weights["gate"])).astype(np.float32)  # [n, E]
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        scores = probs
        if "e_score_correction_bias" in self.weights:
            scores = probs + np.from_dlpack(self.weights["e_score_correction_bias"])[0]
        experts = np.argsort(-scores, axis=1, kind="stable")[:, : self.top_k]  # ties: lower id, as torch.topk
        weights = np.take_along_axis(probs, experts, axis=1)
        if self.normalize:
            weights = weights / np.maximum(weights.sum(axis=1, keepdims=True), self.norm_min)
        return Routing(experts, weights.astype(np.float32))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        # x: [n, hidden] -> [n, hidden]
        routing = self.route(x)
        out = np.zeros(x.shape, np.float32)
        for e in np.unique(routing.experts):
            tokens, slot = np.nonzero(routing.experts == e)
            h = paddle.gather(x, paddle.to_tensor(tokens))
            y = paddle.matmul(silu_and_mul(paddle.matmul(h, self.weights[f"gate_up.{e}"])), self.weights[f"down.{e}"])
            np.add.at(out, tokens, np.from_dlpack(y) * routing.weights[tokens, slot, None])
        result = paddle.to_tensor(out)
        return result + self.shared.forward(x) if self.shared is not None else result

    def hf_weight_table(self) -> dict:
        """HF name (inside the layer) -> (weights dict, key, column range or None, transpose?)."""
        w, i = self.weights, self.inter
        table = {"mlp.gate.weight": (w, "gate", None, True)}
        if "e_score_correction_bias" in w:
            table["mlp.moe_statics.e_score_correction_bias"] = (w, "e_score_correction_bias", None, False)
        for e in range(self.num_experts):
            table[f"mlp.experts.{e}.gate_proj.weight"] = (w, f"gate_up.{e}", (0, i), True)
            table[f"mlp.experts.{e}.up_proj.weight"] = (w, f"gate_up.{e}", (i, 2 * i), True)
            table[f"mlp.experts.{e}.down_proj.weight"] = (w, f"down.{e}", None, True)
        if self.shared is not None:
            table.update(self.shared.hf_weight_table())
        return table
