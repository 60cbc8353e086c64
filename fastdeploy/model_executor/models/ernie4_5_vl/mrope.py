"""3-D multimodal RoPE (M-RoPE) of ERNIE-4.5-VL's text decoder, on positions `[3, num_tokens]` (t, h, w).

ERNIE rotates interleaved pairs (dims 2i, 2i + 1 of each head). Frequency i (inv_freq[i] =
theta^(-2i / head_dim)) turns by the position on one axis: for i < h + w (the first two sections
of `mrope_section`), the h position when i is even and the w position when i is odd; for the last
t frequencies, the t position. (transformers 5.23 Ernie4_5_VLMoeTextRotaryEmbedding: its
pre-rotated inv_freq_3d and `recomposition_frequencies` amount to this.) Text tokens carry equal
t, h and w, where this is the 1-D interleaved RoPE.

The q/k rows of each head are reordered at load (models/ernie4_5.py `interleaved_to_halves`), so pair
i is (i, i + head_dim / 2) here and the rotate-half kernel (ops/rotary_embedding.py) applies it,
with per-token tables: token j's cos/sin row at "position" j.
"""
from typing import Optional

import numpy as np
import paddle

from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.ops.rotary_embedding import rotary_embedding_


def rotation_tables(angles: np.ndarray) -> tuple[paddle.Tensor, paddle.Tensor]:
    """(cos, sin_signed) [n, 2 * k] of angles [n, k] float32 for the rotate-half kernel (pair (i, i + k)
    turned by angles[:, i]); sin_signed carries rotate_half's sign in its first half."""
    cos, sin = np.cos(angles), np.sin(angles)
    return (as_paddle(np.concatenate([cos, cos], axis=1)),
            as_paddle(np.concatenate([-sin, sin], axis=1)))


class MRotaryEmbedding:
    """Same `rotate_` call as layers/rotary_embedding.py RotaryEmbedding, positions [3, n] (or [n])."""

    def __init__(self, head_dim: int, rope_theta: float, mrope_section: tuple[int, int, int]):
        h, w, _ = mrope_section  # the t frequencies are the rest
        half = head_dim // 2
        exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
        self.inv_freq = (np.float32(1.0) / (np.float32(rope_theta) ** exponents)).astype(np.float32)  # [half]
        index = np.arange(half)
        self.axis = np.where(index >= h + w, 0, np.where(index % 2 == 0, 1, 2))  # [half] row of positions
        self.head_dim = head_dim
        self._key: Optional[paddle.Tensor] = None  # the positions the tables below belong to
        self._tables = None

    def angles(self, positions: np.ndarray) -> np.ndarray:
        """positions [3, n] (t, h, w) or [n] int -> angles [n, head_dim / 2] float32."""
        positions = np.asarray(positions)
        if positions.ndim == 1:
            positions = np.broadcast_to(positions, (3, positions.shape[0]))
        return positions[self.axis].T.astype(np.float32) * self.inv_freq  # [n, half]

    def rotate_(self, positions: paddle.Tensor, qkv: paddle.Tensor, num_heads: int, num_kv_heads: int) -> None:
        """Rotate the q and k heads of qkv [n, (num_heads + 2 num_kv_heads) * head_dim] in place.

        The tables are built once per positions tensor (the model hands every layer the same one).
        """
        if positions is not self._key:
            cos, sin_signed = rotation_tables(self.angles(positions.numpy()))
            self._tables = (paddle.arange(qkv.shape[0], dtype="int64"), cos, sin_signed)
            self._key = positions
        rows, cos, sin_signed = self._tables
        rotary_embedding_(qkv, rows, cos, sin_signed, num_heads, num_kv_heads, self.head_dim)
