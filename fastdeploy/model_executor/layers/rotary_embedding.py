"""Rotary position embedding (RoPE, Su et al. 2021), rotate-half ("NeoX") layout as in Llama.

Frequencies follow transformers' `ROPE_INIT_FUNCTIONS` for the rope types we support: "default",
"linear" (positions divided by `factor`) and "llama3" (Llama 3.1's wavelength-dependent scaling).
The tables are computed in float32 the way transformers computes them, so logits match it.
The rotation kernel (compiled `fd_rotary_embedding`, or the pure-Paddle reference of
ops/rotary_embedding.py) is chosen when the tables are built. Positions always come from the
model's `positions` argument (an M-RoPE variant would take its `[3, num_tokens]` form there).
"""
import math
from typing import Optional

import numpy as np
import paddle

from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.ops import compiled_op
from fastdeploy.model_executor.ops.rotary_embedding import paddle_rotary_embedding_


def _llama3_inv_freq(inv_freq: np.ndarray, scaling: dict) -> np.ndarray:
    factor = scaling["factor"]
    low_freq_factor = scaling.get("low_freq_factor", 1.0)
    high_freq_factor = scaling.get("high_freq_factor", 4.0)
    old_context = scaling.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


class RotaryEmbedding:
    """Precomputed cos/sin tables [max_position, head_dim] for the rotate-half layout.

    `cos` and `sin_signed` (sin with rotate_half's sign folded into its first half) are what
    ops/rotary_embedding.py's `rotary_embedding_` rotates q and k with.
    """

    def __init__(self, head_dim: int, rope_theta: float, max_position: int, scaling: Optional[dict]):
        exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
        inv_freq = (np.float32(1.0) / (np.float32(rope_theta) ** exponents)).astype(np.float32)
        if scaling and scaling["rope_type"] == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling)
        elif scaling and scaling["rope_type"] == "linear":
            inv_freq = (inv_freq / np.float32(scaling["factor"])).astype(np.float32)
        positions = np.arange(max_position, dtype=np.float32)
        freqs = np.outer(positions, inv_freq).astype(np.float32)  # [max_position, head_dim / 2]
        angles = np.concatenate([freqs, freqs], axis=-1)  # [max_position, head_dim]
        half = head_dim // 2
        sign = np.concatenate([-np.ones(half, np.float32), np.ones(half, np.float32)])
        self.cos = as_paddle(np.cos(angles))
        self.sin_signed = as_paddle(np.sin(angles) * sign)  # rotate_half's sign folded in
        self.head_dim = head_dim
        self._op = compiled_op("fd_rotary_embedding")

    def rotate_(self, positions: paddle.Tensor, qkv: paddle.Tensor, num_heads: int, num_kv_heads: int) -> None:
        """Rotate the q and k heads of qkv [n, (num_heads + 2 num_kv_heads) * head_dim] (contiguous
        float32) in place by positions [n] int64; v is left bit-identical (see rotary_embedding_)."""
        if self._op is not None:
            self._op(qkv, positions, self.cos, self.sin_signed, num_heads, num_kv_heads, self.head_dim)
        else:
            paddle_rotary_embedding_(qkv, positions, self.cos, self.sin_signed, num_heads + num_kv_heads,
                                      self.head_dim)
