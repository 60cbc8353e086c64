"""llama.cpp GGUF weights kept in their blocks and multiplied by the compiled `gguf_linear` op.

`GGUFConfig` is built from the GGUF header (model_loader/gguf_loader.py), which gives every
tensor's type before any data is read, so each Linear's method is decided when the layer is built
(`GGUFConfig.linear_method`):

  * `GGUFLinearMethod` when all the checkpoint tensors it packs are of one type the op computes on
    (model_loader/quantized.py LINEAR_QTYPES: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
    Q6_K) and the compiled ops are available (not built, or built under `fallbacks_forced()`: no);
  * `SegmentedGGUFLinearMethod` when they are of several such types (Q4_K_M files hold v in Q6_K
    beside q and k in Q4_K in some layers): each part in its own type's blocks, one after another in
    one parameter that the op reads segment by segment;
  * else the dense float32 method: F16 / BF16 / F32 matrices (BF16 too: the packed bf16 method would
    hold half the bytes but rounds x to bf16, which moved a tiny ERNIE-4.5-MoE's prefill logits 6e-3
    relative from transformers' float32 ones), or no compiled op.

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
        types = [self.tensor_types.get(name) for name in checkpoint_names]  # in shard order
        linear, interleave = compiled_op("gguf_linear"), compiled_op("gguf_interleave_rows")
        if not set(types) <= set(LINEAR_QTYPES) or linear is None or interleave is None:
            return UnquantizedLinearMethod()  # float tensors, or no compiled op
        if len(set(types)) > 1:
            return SegmentedGGUFLinearMethod(types, linear, interleave)
        return GGUFLinearMethod(types[0], linear, interleave)


def _check_announced_type(loaded, qtype: int) -> None:
    """ValueError unless `loaded` is a QuantizedTensor of `qtype`, the type the file's header gave it."""
    if not isinstance(loaded, QuantizedTensor) or loaded.qtype != qtype:
        got = loaded.qtype if isinstance(loaded, QuantizedTensor) else "float"
        raise ValueError(f"is of GGUF type {got}, but the file's header announced type {qtype}")


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
        _check_announced_type(loaded, self.qtype)
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


SEGMENTED = 1100  # the op's type id for a segmented weight (custom_ops/cpu_ops/gguf_linear.cc)
_SEGMENT_WORDS = 5  # int64 header words per segment: type, output rows, the weight's 2 dims, byte offset


class SegmentedGGUFLinearMethod(LinearMethod):
    """W of a Linear whose shards are GGUF matrices of different LINEAR_QTYPES types (`qtypes`, in shard
    order): one 1-D uint8 parameter, a header of int64 words [count, per shard: type, output rows, the
    2 dims of its block weight, byte offset] padded to 64 bytes, then each shard's weight in its own
    type's layout (quantized.block_shape; Q4_0 / Q4_1 / Q8_0 interleaved when the shard arrives). The op
    (type id SEGMENTED) multiplies each segment as a GGUFLinearMethod would and writes its columns of y."""

    def __init__(self, qtypes: list, linear_op: Callable, interleave_op: Callable):
        self.qtypes = list(qtypes)
        self._linear = linear_op
        self._interleave = interleave_op
        self._segments = []  # per shard: (type, start row, end row, block shape, byte offset)

    def create_weights(self, layer: Linear) -> paddle.Tensor:
        ranges = list(layer.shard_ranges.values())
        if len(ranges) != len(self.qtypes):
            raise ValueError(f"{len(self.qtypes)} GGUF types for a layer of {len(ranges)} shards")
        offset = -(-8 * (1 + _SEGMENT_WORDS * len(ranges)) // 64) * 64
        for qtype, (start, end) in zip(self.qtypes, ranges):
            shape = block_shape(qtype, end - start, layer.in_features)
            self._segments.append((qtype, start, end, shape, offset))
            offset += -(-shape[0] * shape[1] // 64) * 64
        return empty_parameter([offset], "uint8", layer.weight_loader)

    def header(self) -> np.ndarray:
        """The weight's leading int64 words."""
        words = [len(self._segments)]
        for qtype, start, end, shape, offset in self._segments:
            words += [qtype, end - start, shape[0], shape[1], offset]
        return np.array(words, np.int64)

    def load(self, layer: Linear, loaded, start: int, end: int) -> None:
        segment = next((s for s in self._segments if s[1:3] == (start, end)), None)
        if segment is None:
            raise ValueError(f"rows {start}:{end} are not one part of this layer")
        qtype, _, _, shape, offset = segment
        _check_announced_type(loaded, qtype)
        blocks = np.asarray(loaded.blocks)
        if qtype in INTERLEAVED_QTYPES:
            blocks = np.from_dlpack(self._interleave(as_paddle(np.ascontiguousarray(blocks)), qtype))
        weight = np.from_dlpack(layer.weight)
        header = self.header().view(np.uint8)
        weight[: header.size] = header
        weight[offset : offset + shape[0] * shape[1]] = blocks.reshape(-1)

    def apply(self, layer: Linear, x: paddle.Tensor) -> paddle.Tensor:
        # x: [n, in] -> [n, out]
        return epilogue(layer, self._linear(x, layer.weight, SEGMENTED, layer.out_features))

    def operand(self, layer: Linear, rows: int) -> tuple[paddle.Tensor, int]:
        return layer.weight, SEGMENTED
