"""A GGUF-quantized matrix as the loader hands it over: its blocks, not yet dequantized."""
from dataclasses import dataclass

import numpy as np

# ggml type ids the compiled `gguf_linear` op computes with (custom_ops/cpu_ops/gguf_linear.cc)
Q4_0, Q4_1, Q8_0 = 2, 3, 8
LINEAR_QTYPES = (Q4_0, Q4_1, Q8_0)


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
