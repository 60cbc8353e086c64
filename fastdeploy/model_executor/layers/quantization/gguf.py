"""llama.cpp GGUF weights kept in their blocks and multiplied by the compiled `gguf_linear` op.

`GGUFConfig` is built from the GGUF header (model_loader/gguf_loader.py), which gives every
tensor's type before any data is read, so each Linear's method is decided when the layer is built:
`GGUFLinearMethod` when all the checkpoint tensors it packs are of one type the op computes on
(Q4_0, Q4_1, Q8_0) and the compiled ops are available (not built, or built under
`fallbacks_forced()`: no), else the dense float32 method (dequantized once at load).

GGUFLinearMethod's weight parameter holds the blocks rearranged once by `gguf_interleave_rows` into
groups of 4 rows with float32 scales, [ceil(out / 4), in / 32 * group bytes] uint8: a matmul then
reads 5-9 bits per weight instead of 32 and dequantizes in registers, computing the same function
as a float32 matmul on the dequantized weights (the values gguf-py's `dequantize` gives, which is
what transformers loads). From DENSE_FROM_ROWS rows of x the weight is multiplied as float32 by
Paddle's GEMM (MKL) on a dense copy made on the first such call.
"""
from typing import Callable, Optional, Sequence

import numpy as np
import paddle

from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.linear import (Linear, LinearMethod, QuantConfig, UnquantizedLinearMethod,
                                                     copy_transposed, epilogue)
from fastdeploy.model_executor.layers.parameters import empty_parameter
from fastdeploy.model_executor.model_loader.quantized import (QuantizedTensor, blocks_from_interleaved,
                                                              interleaved_shape)
from fastdeploy.model_executor.ops import compiled_op

# Rows of x from which a quantized weight is multiplied as float32 by Paddle's GEMM (MKL) instead of
# the block kernel. Measured (benchmarks/README.md at commit 9c89004): at 32 rows the block kernel is ~1.2x faster
# on a hot weight and more in a model, where float32 weights stream from memory at 4-7x the bytes; from
# 64 rows the matmul is compute-bound and MKL's kernel is faster (1.1x at 64, 1.5x at 256). The float32
# copy is made on the first such call (a long prefill) and kept: memory then holds both.
DENSE_FROM_ROWS = 64


class GGUFConfig(QuantConfig):
    """tensor_types: HF name -> ggml type id of each GGUF matrix the loader hands over as a QuantizedTensor."""

    def __init__(self, tensor_types: dict[str, int]):
        self.tensor_types = tensor_types

    def linear_method(self, checkpoint_names: Sequence[str]) -> LinearMethod:
        types = {self.tensor_types.get(name) for name in checkpoint_names}
        linear, interleave = compiled_op("gguf_linear"), compiled_op("gguf_interleave_rows")
        if len(types) != 1 or None in types or linear is None or interleave is None:
            return UnquantizedLinearMethod()  # float tensors, mixed types, or no compiled op
        return GGUFLinearMethod(types.pop(), linear, interleave)


class GGUFLinearMethod(LinearMethod):
    """W as interleaved GGUF blocks of `qtype`; shards are staged as GGUF rows until all have arrived."""

    def __init__(self, qtype: int, linear_op: Callable, interleave_op: Callable):
        self.qtype = qtype
        self._linear = linear_op
        self._interleave = interleave_op
        self._staged: Optional[np.ndarray] = None  # [out, bytes per row] uint8 while shards arrive
        self._staged_rows = 0
        self._dense: Optional[paddle.Tensor] = None  # [in, out] float32, made for the first large call

    def create_weights(self, layer: Linear) -> paddle.Tensor:
        shape = interleaved_shape(self.qtype, layer.out_features, layer.in_features)
        return empty_parameter(shape, "uint8", layer.weight_loader)

    def load(self, layer: Linear, loaded, start: int, end: int) -> None:
        if not isinstance(loaded, QuantizedTensor) or loaded.qtype != self.qtype:
            got = loaded.qtype if isinstance(loaded, QuantizedTensor) else "float"
            raise ValueError(f"is of GGUF type {got}, but the file's header announced type {self.qtype}")
        if self._staged is None:
            self._staged = np.empty((layer.out_features, loaded.blocks.shape[1]), np.uint8)
        self._staged[start:end] = loaded.blocks
        self._staged_rows += end - start
        if self._staged_rows == layer.out_features:  # every shard is in: interleave once
            packed = self._interleave(as_paddle(self._staged), self.qtype)
            np.from_dlpack(layer.weight)[...] = np.from_dlpack(packed)
            self._staged, self._staged_rows = None, 0

    def apply(self, layer: Linear, x: paddle.Tensor) -> paddle.Tensor:
        # x: [n, in] -> [n, out]
        weight, qtype = self.operand(layer, x.shape[0])
        y = self._linear(x, weight, qtype, layer.out_features) if qtype else paddle.matmul(x, weight)
        return epilogue(layer, y)

    def operand(self, layer: Linear, rows: int) -> tuple[paddle.Tensor, int]:
        if rows < DENSE_FROM_ROWS:
            return layer.weight, self.qtype
        if self._dense is None:  # first large batch: dequantize once, keep both
            blocks = blocks_from_interleaved(layer.weight.numpy(), self.qtype, layer.out_features)
            self._dense = paddle.empty([layer.in_features, layer.out_features])
            copy_transposed(np.from_dlpack(self._dense), QuantizedTensor(blocks, self.qtype,
                                                                         layer.in_features).dequantize())
        return self._dense, 0
