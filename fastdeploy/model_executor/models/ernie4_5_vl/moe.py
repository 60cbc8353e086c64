"""ERNIE-4.5-VL's MoE MLP: modality-isolated text and vision experts plus shared experts
(transformers 5.23 Ernie4_5_VLMoeMoeBlock; FastDeploy ernie4_5_vl_moe.py Ernie4_5_VLMoE).

Text tokens are routed among the E text experts by the text router, vision tokens (placeholders
and image/video delimiters: the `modality` the model derives from the token ids) among the E
vision experts by the vision router; each router is layers/moe.py `select_experts` (float32
softmax, top-k chosen by p + that modality's correction bias, weights p renormalised by
max(sum, moe_norm_min)). Every token also goes through the shared experts (one SwiGLU MLP of
moe_intermediate_size[text] x moe_num_shared_experts).

Parameters, named as the checkpoint's: mlp.gate.weight (text router) and mlp.gate.weight_1 (vision
router), each [hidden, E] used as x @ W; mlp.moe_statics.e_score_correction_bias [2, E] (row 0 text,
row 1 vision); mlp.experts.{0..E-1} text experts (moe_intermediate_size[0]), mlp.experts.{E..2E-1}
vision experts (moe_intermediate_size[1]); mlp.shared_experts.
"""
from typing import Optional

import numpy as np
import paddle

from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.linear import QuantConfig
from fastdeploy.model_executor.layers.mlp import DenseMLP
from fastdeploy.model_executor.layers.moe import run_experts, select_experts
from fastdeploy.model_executor.layers.parameters import empty_parameter
from fastdeploy.model_executor.models.ernie4_5_vl.config import VLConfig


class Routers(paddle.nn.Layer):
    """`gate`: the text router `weight` and the vision router `weight_1`, each [hidden, E] float32."""

    def __init__(self, hidden: int, num_experts: int):
        super().__init__()
        self.weight = empty_parameter([hidden, num_experts])
        self.weight_1 = empty_parameter([hidden, num_experts])


class CorrectionBiases(paddle.nn.Layer):
    def __init__(self, num_experts: int):
        super().__init__()
        self.e_score_correction_bias = empty_parameter([2, num_experts])  # row 0 text, row 1 vision


class ModalityIsolatedMoE(paddle.nn.Layer):
    def __init__(self, hidden: int, config: VLConfig, quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        e = self.num_experts = config.num_experts
        self.top_k, self.norm_min = config.moe_k, config.moe_norm_min
        text_inter, vision_inter = config.moe_intermediate_size
        self.gate = Routers(hidden, e)
        self.moe_statics = CorrectionBiases(e) if config.moe_correction_bias else None
        self.experts = paddle.nn.LayerList(
            [DenseMLP(hidden, text_inter, False, quant_config, f"{prefix}.experts.{i}") for i in range(e)]
            + [DenseMLP(hidden, vision_inter, False, quant_config, f"{prefix}.experts.{i}") for i in range(e, 2 * e)])
        shared = text_inter * config.moe_num_shared_experts
        self.shared_experts = (DenseMLP(hidden, shared, False, quant_config, f"{prefix}.shared_experts")
                               if shared else None)

    def forward(self, x: paddle.Tensor, modality: Optional[paddle.Tensor] = None) -> paddle.Tensor:
        """x [n, hidden] -> [n, hidden]; modality [n] int64, nonzero for tokens of the vision experts
        (None: all text)."""
        is_vision = np.zeros(x.shape[0], bool) if modality is None else modality.numpy() != 0
        out = np.zeros(x.shape, np.float32)
        for m, rows in enumerate((np.nonzero(~is_vision)[0], np.nonzero(is_vision)[0])):
            if not len(rows):
                continue
            part = x if len(rows) == x.shape[0] else paddle.gather(x, as_paddle(rows))  # [rows, hidden]
            router = self.gate.weight_1 if m else self.gate.weight
            bias = None if self.moe_statics is None else np.from_dlpack(self.moe_statics.e_score_correction_bias)[m]
            routing = select_experts(np.from_dlpack(paddle.matmul(part, router)), self.top_k, True, self.norm_min,
                                     bias)
            routing.experts += m * self.num_experts  # vision experts follow the text ones
            out[rows] = run_experts(part, routing, self.experts)
        result = as_paddle(out)
        return result + self.shared_experts(x) if self.shared_experts is not None else result
