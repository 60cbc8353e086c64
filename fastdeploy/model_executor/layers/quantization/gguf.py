"""llama.cpp GGUF weights kept in their blocks and multiplied by the compiled `gguf_linear` op.

`GGUFConfig` is built from the GGUF header (model_loader/gguf_loader.py), which gives every
tensor's type before any data is read, so each Linear's method is decided when the layer is built
(`GGUFConfig.linear_method`):

  * `GGUFLinearMethod` when all the checkpoint tensors it packs are of one type the op computes on
    (model_loader/quantized.py LINEAR_QTYPES: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
    Q6_K) and the compiled ops are available (not built, or built under `fallbacks_forced()`: no);
  * else the dense float32 method: F16 / BF16 / F32 matrices (BF16 too: the packed bf16 method would
    hold half the bytes but rounds x to bf16, which moved a tiny ERNIE-4.5-MoE's prefill logits 6e-3
    relative from transformers' float32 ones), a Linear whose parts differ in type (dequantized once at
    load), or no compiled op.

GGUFLinearMethod's weight parameter holds Q4_0 / Q4_1 / Q8_0 rearranged once by `gguf_interleave_rows`
into groups of 4 rows with float32 scales ([ceil(out / 4), in / 32 * group bytes] uint8), and the other
types as the file stores them, row-major ([out, in / values * block bytes] uint8: loading copies each
shard's rows, so the layer holds the file's bytes). The op (custom_ops/cpu_ops/gguf_linear.cc)
dequantizes the weights in registers / L1 to exactly gguf-py's `dequantize` values and multiplies them
in float32 at every row count, choosing its kernel by the rows of x: the same function as a float32
matmul on the dequantized matrix up to the order of the sums, without a float32 copy of the weight.
"""
from typing import Callable, Optional, Sequence

import numpy as np
import paddle

from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.linear import Linear, LinearMethod, QuantConfig, UnquantizedLinearMethod, epilogue
from fastdeploy.model_executor.layers.parameters import empty_parameter
from fastdeploy.model_executor.model_loader.quantized import (INTERLEAVED_QTYPES, LINEAR_QTYPES, QuantizedTensor,
                                                              block_shape)
from fastdeploy.model_executor.ops import compiled_op


class GGUFConfig(QuantConfig):
    """tensor_types: HF name -> ggml type id of each GGUF matrix (gguf_loader.gguf_quant_config)."""

    def __init__(self, tensor_types: dict[str, int]):
        self.tensor_types = tensor_types

    def linear_method(self, checkpoint_names: Sequence[str]) -> LinearMethod:
        types = {self.tensor_types.get(name) for name in checkpoint_names}
        linear, interleave = compiled_op("gguf_linear"), compiled_op("gguf_interleave_rows")
        if len(types) != 1 or not types <= set(LINEAR_QTYPES) or linear is None or interleave is None:
            return UnquantizedLinearMethod()  # float tensors, mixed types, or no compiled op
        return GGUFLinearMethod(types.pop(), linear, interleave)


class GGUFLinearMethod(LinearMethod):
    """W as GGUF blocks of `qtype`: row-major as the file stores them, or (INTERLEAVED_QTYPES) staged as
    GGUF rows until all shards have arrived, then interleaved once."""

    def __init__(self, qtype: int, linear_op: Callable, interleave_op: Callable):
        self.qtype = qtype
        self.interleaved = qtype in INTERLEAVED_QTYPES
        self._linear = linear_op
        self._interleave = interleave_op
        self._staged: Optional[np.ndarray] = None  # [out, bytes per row] uint8 while shards arrive
        self._staged_rows = 0

    def create_weights(self, layer: Linear) -> paddle.Tensor:
        shape = block_shape(self.qtype, layer.out_features, layer.in_features)
        return empty_parameter(shape, "uint8", layer.weight_loader)

    def load(self, layer: Linear, loaded, start: int, end: int) -> None:
        if not isinstance(loaded, QuantizedTensor) or loaded.qtype != self.qtype:
            got = loaded.qtype if isinstance(loaded, QuantizedTensor) else "float"
            raise ValueError(f"is of GGUF type {got}, but the file's header announced type {self.qtype}")
        if not self.interleaved:  # the file's rows are the parameter's
            np.from_dlpack(layer.weight)[start:end] = loaded.blocks
            return
        if self._staged is None:
            self._staged = np.empty((layer.out_features, loaded.blocks.shape[1]), np.uint8)
        self._staged[start:end] = loaded.blocks
        self._staged_rows += end - start
        if self._staged_rows == layer.out_features:  # every shard is in: interleave once
            packed = self._interleave(as_paddle(self._staged), self.qtype)
            np.from_dlpack(layer.weight)[...] = np.from_dlpack(packed)
            self._staged, self._staged_rows = None, 0

    def apply(self, layer: Linear, x: paddle.Tensor) -> paddle.Tensor:
        # x: [n, in] -> [n, out]; the op picks its kernel by the rows of x
        return epilogue(layer, self._linear(x, layer.weight, self.qtype, layer.out_features))

    def operand(self, layer: Linear, rows: int) -> tuple[paddle.Tensor, int]:
        return layer.weight, self.qtype

    def rows(self, layer: Linear, ids: paddle.Tensor) -> paddle.Tensor:
        """ids [n] int64 -> dequantize(W)[ids] [n, in] float32, gguf-py's values (an embedding's lookup:
        layers/embeddings.py GGUFEmbedding, or TiedEmbedding on a tied lm_head)."""
        return compiled_op("gguf_embedding")(ids, layer.weight, self.qtype, layer.out_features, layer.in_features)
