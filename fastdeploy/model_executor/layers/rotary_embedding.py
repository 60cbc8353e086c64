"""Rotary position embedding (RoPE, Su et al. 2021), rotate-half ("NeoX") layout as in Llama.

Frequencies follow transformers' `ROPE_INIT_FUNCTIONS` for the rope types we support: "default",
"linear" (positions divided by `factor`) and "llama3" (Llama 3.1's wavelength-dependent scaling).
The tables are computed in float32 the way transformers computes them, so logits match it.
"""
import math
from typing import Optional

import numpy as np
import paddle


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
    """Precomputed cos/sin tables; `apply` rotates q/k heads in the rotate-half layout."""

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
        self.half = half
        self.cos = paddle.to_tensor(np.cos(angles))
        self.sin_signed = paddle.to_tensor(np.sin(angles) * sign)  # rotate_half's sign folded in

    def tables(self, positions: paddle.Tensor, num_heads: int) -> tuple[paddle.Tensor, paddle.Tensor]:
        """cos, signed sin for the step's tokens, each [num_tokens, num_heads, head_dim].

        Expanded to full shape once per step: Paddle's CPU elementwise kernels are ~25x slower
        when broadcasting over a middle axis than on same-shape operands.
        """
        cos = paddle.gather(self.cos, positions).unsqueeze(1)
        sin = paddle.gather(self.sin_signed, positions).unsqueeze(1)
        shape = [positions.shape[0], num_heads, cos.shape[-1]]
        return cos.expand(shape).contiguous(), sin.expand(shape).contiguous()

    def apply(self, x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
        # x, cos, sin: [num_tokens, num_heads, head_dim]; rotate_half(x) = [-x2, x1] = roll(x, half) * sign
        return x * cos + paddle.roll(x, self.half, axis=-1) * sin
