"""One image or video of a prompt, preprocessed, as it travels with its request.

The input processor makes these (pixels resized, normalised and cut into patches) and expands the
item's placeholder into `length` placeholder tokens at `offset` in the prompt; the scheduler mixes
`mm_hash` into the prefix-cache key of every block the item's tokens overlap; the model runner runs
the vision encoder on `pixel_values` and puts its output rows at the placeholder positions.
Layout as transformers' `Ernie4_5_VLMoe` processors produce it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class MultiModalFeature:
    """One preprocessed image or video of a prompt.

    Attributes:
        modality: "image" or "video".
        offset: index in the prompt's token ids of the first placeholder token of this item.
        length: number of placeholder tokens (the encoder's output rows for it).
        pixel_values: [num_patches, channels * patch * patch] float32, patch rows in the
            processor's merge-block order (num_patches = t * h * w).
        grid_thw: (t, h, w): frames and patch rows/columns before the spatial merge.
        mm_hash: hex digest of the item's pixels and grid; equal items share it (prefix cache key).
    """

    modality: str
    offset: int
    length: int
    pixel_values: np.ndarray
    grid_thw: tuple[int, int, int]
    mm_hash: str
