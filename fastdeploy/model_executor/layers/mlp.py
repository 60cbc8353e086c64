"""SwiGLU MLP (Shazeer 2020): down(silu(gate(x)) * up(x)), with gate and up packed into one projection.

Checkpoint tensors `{prefix}.gate_proj.*` and `{prefix}.up_proj.*` fill `gate_up_proj` (shards 0
and 1: columns [gate | up]); `{prefix}.down_proj.*` fills `down_proj`. The SwiGLU is gate_up_proj's
activation ("swiglu", layers/linear.py): the packed bf16/wint8/wint4 method computes it where its kernel
writes the product (the weight stored with gate and up interleaved, layers/quantization/packed.py), the
others with the compiled `fd_silu_and_mul` (or Paddle's F.swiglu, its reference) after the product.
"""
from typing import Optional

import paddle

from fastdeploy.model_executor.layers.linear import Linear, QuantConfig, select_linear_method


class DenseMLP(paddle.nn.Layer):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, quant_config: Optional[QuantConfig],
                 prefix: str):
        super().__init__()
        self.intermediate_size = intermediate_size
        self.has_bias = bias
        gate_up = [f"{prefix}.gate_proj.weight", f"{prefix}.up_proj.weight"]
        self.gate_up_proj = Linear(hidden_size, {0: intermediate_size, 1: intermediate_size}, bias,
                                   select_linear_method(quant_config, gate_up), activation="swiglu")
        self.down_proj = Linear(intermediate_size, {None: hidden_size}, bias,
                                select_linear_method(quant_config, [f"{prefix}.down_proj.weight"]))

    def forward(self, x: paddle.Tensor, token_type_ids: Optional[paddle.Tensor] = None) -> paddle.Tensor:
        """x: [n, hidden] -> [n, hidden]. token_type_ids: the MoE layers' argument, unused here."""
        return self.down_proj(self.gate_up_proj(x))  # [n, hidden] -> silu(gate) * up [n, inter] -> [n, hidden]
