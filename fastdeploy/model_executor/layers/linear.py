"""Linear weights: dense float32 [in, out], or llama.cpp GGUF blocks [out, bytes] computed on the fly.

A `LinearWeight` is filled by the loader one checkpoint tensor at a time, each covering a range of
its output features (fused projections such as qkv and gate_up take several). Tensors that arrive
GGUF-quantized (`QuantizedTensor`: Q4_0, Q4_1, Q8_0) stay in their blocks when the compiled
`gguf_linear` op is available and every part of the weight has the same type (rearranged once by
`gguf_interleave_rows` into groups of 4 rows with float32 scales): a matmul then reads 5-9 bits per
weight instead of 32 and dequantizes in registers, computing the same function as a
float32 matmul on the dequantized weights (the values gguf-py's `dequantize` gives, which is what
transformers loads). Otherwise (float checkpoints, mixed types, no compiled op) the weight is
dequantized once at load into a dense [in, out] float32 tensor for `paddle.matmul`. Quantized weights
also get a dense copy the first time they multiply DENSE_FROM_ROWS rows or more (see there).
"""
from typing import Optional

import numpy as np
import paddle

from fastdeploy.model_executor.model_loader.quantized import QuantizedTensor, blocks_from_interleaved
from fastdeploy.model_executor.ops import compiled_op

# Rows of x from which a quantized weight is multiplied as float32 by Paddle's GEMM (MKL) instead of
# the block kernel. Measured here (benchmarks/README.md): at 32 rows the block kernel is ~1.2x faster
# on a hot weight and more in a model, where float32 weights stream from memory at 4-7x the bytes; from
# 64 rows the matmul is compute-bound and MKL's kernel is faster (1.1x at 64, 1.5x at 256). The float32
# copy is made on the first such call (a long prefill) and kept: memory then holds both.
DENSE_FROM_ROWS = 64


class LinearWeight:
    """W of y = x @ W with in_features rows and out_features columns (Paddle's [in, out] orientation)."""

    def __init__(self, in_features: int, out_features: int):
        self.in_features, self.out_features = in_features, out_features
        self.dense: Optional[paddle.Tensor] = None  # [in, out] float32
        self.blocks: Optional[paddle.Tensor] = None  # [ceil(out / 4), in / 32 * group bytes] uint8, interleaved
        self.qtype: Optional[int] = None  # ggml type id of `blocks`
        self._op = compiled_op("gguf_linear")
        self._interleave = compiled_op("gguf_interleave_rows")
        self._parts: dict[tuple[int, int], QuantizedTensor] = {}  # quantized parts waiting for the rest

    @property
    def shape(self) -> list[int]:
        return [self.in_features, self.out_features]

    def load(self, cols: Optional[tuple[int, int]], array) -> None:
        """Fill output features cols[0]:cols[1] (all when None) from an HF-orientation [out, in] array.

        `array`: float32 numpy array or QuantizedTensor. Raises ValueError on a wrong shape.
        """
        start, end = cols if cols is not None else (0, self.out_features)
        if tuple(array.shape) != (end - start, self.in_features):
            raise ValueError(f"has shape {list(array.shape)}, expected {[end - start, self.in_features]}")
        if isinstance(array, QuantizedTensor) and self._op is not None and self.dense is None:
            self._parts[(start, end)] = array
            if sum(e - s for s, e in self._parts) == self.out_features:
                self._assemble_blocks()
            return
        self._densify_parts()
        self._copy_dense(start, array.dequantize() if isinstance(array, QuantizedTensor) else array)

    def __call__(self, x: paddle.Tensor) -> paddle.Tensor:
        # x: [n, in] -> [n, out]
        weight, qtype = self.operand(x.shape[0])
        return self._op(x, weight, qtype, self.out_features) if qtype else paddle.matmul(x, weight)

    def operand(self, rows: int) -> tuple[paddle.Tensor, int]:
        """What multiplies `rows` rows of x: (GGUF blocks, ggml type id) below DENSE_FROM_ROWS rows when
        the weight has blocks, else (dense [in, out] float32, 0), made on the first such call."""
        if self.blocks is not None and rows < DENSE_FROM_ROWS:
            return self.blocks, self.qtype
        if self.dense is None:  # first large batch of a quantized weight: dequantize once, keep both
            blocks = blocks_from_interleaved(self.blocks.numpy(), self.qtype, self.out_features)
            self._copy_dense(0, QuantizedTensor(blocks, self.qtype, self.in_features).dequantize())
        return self.dense, 0

    def _assemble_blocks(self) -> None:
        parts = [self._parts[key] for key in sorted(self._parts)]
        if len({p.qtype for p in parts}) > 1:  # mixed types cannot share one block matrix
            self._densify_parts()
            return
        blocks = np.concatenate([p.blocks for p in parts]) if len(parts) > 1 else parts[0].blocks
        self.qtype = parts[0].qtype
        self.blocks = self._interleave(paddle.to_tensor(blocks), self.qtype)
        self._parts.clear()

    def _densify_parts(self) -> None:
        parts, self._parts = self._parts, {}
        for (start, _), part in sorted(parts.items(), key=lambda item: item[0]):
            self._copy_dense(start, part.dequantize())

    def _copy_dense(self, start: int, array: np.ndarray) -> None:
        if self.dense is None:
            self.dense = paddle.empty(self.shape)
        view = np.from_dlpack(self.dense)[:, start : start + array.shape[0]]
        copy_transposed(view, array)


def copy_transposed(dst: np.ndarray, src: np.ndarray, rows: int = 256) -> None:
    """dst[...] = src.T, in blocks of `rows` source rows: 3x faster than one strided copy on CPU."""
    for start in range(0, src.shape[0], rows):
        dst[..., start : start + rows] = src[start : start + rows].T
