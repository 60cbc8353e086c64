"""A GGUF-quantized matrix as the loader hands it over: its blocks, not yet dequantized.

The compiled `gguf_linear` op (custom_ops/cpu_ops/gguf_linear.cc) computes on LINEAR_QTYPES: Q4_0, Q4_1
and Q8_0 after `gguf_interleave_rows` rearranges them (INTERLEAVED_QTYPES), the others (ROW_MAJOR_QTYPES:
Q5_0, Q5_1 and the K-quants Q2_K..Q6_K, custom_ops/cpu_ops/gguf_rows.h) in GGUF's own row-major blocks,
so a layer holds the file's bytes.
"""
from dataclasses import dataclass

import numpy as np

# ggml type ids
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30
INTERLEAVED_QTYPES = (Q4_0, Q4_1, Q8_0)
# GGUF bytes per row-major block: (values, bytes)
ROW_MAJOR_BLOCKS = {Q5_0: (32, 22), Q5_1: (32, 24), Q2_K: (256, 84), Q3_K: (256, 110), Q4_K: (256, 144),
                    Q5_K: (256, 176), Q6_K: (256, 210)}
ROW_MAJOR_QTYPES = tuple(ROW_MAJOR_BLOCKS)
LINEAR_QTYPES = INTERLEAVED_QTYPES + ROW_MAJOR_QTYPES
FLOAT_QTYPES = (F32, F16, BF16)  # matrices gguf-py reads as floats (dense float32)

# GGUF bytes per block of the interleaved types: (scale and minimum bytes, quant bytes), float16 headers then quants
INTERLEAVED_BLOCKS = {Q4_0: (2, 16), Q4_1: (4, 16), Q8_0: (2, 32)}
ROW_GROUP = 4  # rows per group of the interleaved layout


def block_values(qtype: int) -> int:
    """Weights per block of a LINEAR_QTYPES type along the input features: 256 for the K-quants, 32 for
    the others (a column split of the matrix must fall on a multiple of it)."""
    return ROW_MAJOR_BLOCKS[qtype][0] if qtype in ROW_MAJOR_BLOCKS else 32


def row_major_shape(qtype: int, rows: int, in_features: int) -> list[int]:
    """Shape of a [rows, in_features] weight of a ROW_MAJOR_QTYPES type as GGUF stores it:
    [rows, in_features / values * block bytes] uint8. ValueError when in_features is not whole blocks."""
    values, nbytes = ROW_MAJOR_BLOCKS[qtype]
    if in_features % values:
        raise ValueError(f"in_features {in_features} is not a multiple of GGUF type {qtype}'s block of {values}")
    return [rows, in_features // values * nbytes]


def interleaved_shape(qtype: int, rows: int, in_features: int) -> list[int]:
    """Shape of `gguf_interleave_rows`' output for a [rows, in_features] weight of `qtype`:
    [ceil(rows / 4), in_features / 32 * group bytes] uint8 (custom_ops/cpu_ops/gguf_blocks.h gives the layout)."""
    headers, quant = INTERLEAVED_BLOCKS[qtype]
    group_bytes = 16 * (headers // 2) + ROW_GROUP * quant
    return [-(-rows // ROW_GROUP), in_features // 32 * group_bytes]


def block_shape(qtype: int, rows: int, in_features: int) -> list[int]:
    """Shape of the uint8 weight the compiled op reads for a [rows, in_features] matrix of a LINEAR_QTYPES
    type: interleaved_shape for INTERLEAVED_QTYPES, else row_major_shape (the file's bytes)."""
    return (interleaved_shape if qtype in INTERLEAVED_QTYPES else row_major_shape)(qtype, rows, in_features)


@dataclass
class QuantizedTensor:
    """A [out, in] weight in llama.cpp's block format: each row is in / 32 blocks of `qtype`.

    blocks: [out, bytes per row] uint8, rows in Hugging Face order (a row permutation such as
    gguf_loader.unpermute_qk applies to it as to a dense matrix). Consumers that cannot compute on
    blocks call `dequantize()` (gguf-py's reference dequantization, float32).
    """

    blocks: np.ndarray
    qtype: int
    in_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.blocks.shape[0], self.in_features)

    def dequantize(self) -> np.ndarray:
        import gguf

        return gguf.quants.dequantize(self.blocks, gguf.GGMLQuantizationType(self.qtype)).astype(np.float32, copy=False)
