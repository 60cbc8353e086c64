"""ERNIE-4.5-VL pixels: resize, normalise and cut images and video frames into the vision tower's patches.

Follows transformers' PIL image processor for Ernie4_5_VLMoe (`Ernie4_5_VLMoeImageProcessorPil`), which
FastDeploy's `AdaptiveImageProcessor` matches on the same uint8 input. With patch size p and merge size
m (`PixelFormat`; the defaults 14 and 2 below, the checkpoint's preprocessor_config.json otherwise):
  1. `smart_resize`: both sides a multiple of p * m (28), Python's `round` (ties to even), then scaled
     into [min_pixels, max_pixels] keeping the aspect ratio;
  2. PIL resize of the uint8 RGB image (alpha composited onto white first) with the `resample` filter
     (BICUBIC by default; no reducing_gap);
  3. float32 `(x * rescale_factor - mean) / std`, by default 1/255 and CLIP's mean and std (the
     rescale in float64, as transformers);
  4. patches of 3 x p x p (channel-major rows of 3 p^2 values, 588 for p = 14) in merge-block order:
     for each m x m block of patches (row-major over blocks), its m^2 patches row-major.
A video is its frames processed alike with one size (from the first frame), rows frame-major.
Where transformers and FastDeploy differ, an aspect ratio over 200 follows FastDeploy (the short side is
kept and the long side clamped to 200 times it; transformers raises).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PATCH_SIZE = 14
MERGE_SIZE = 2
FACTOR = PATCH_SIZE * MERGE_SIZE  # 28: both sides of a resized image are multiples of it
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGE_MIN_PIXELS = 4 * 28 * 28
IMAGE_MAX_PIXELS = 6177 * 28 * 28
VIDEO_MIN_PIXELS = 299 * 28 * 28
VIDEO_MAX_PIXELS = 1196 * 28 * 28
MAX_ASPECT_RATIO = 200
BICUBIC = 3  # PIL.Image.Resampling.BICUBIC, transformers' PILImageResampling.BICUBIC
RESAMPLE_FILTERS = (0, 1, 2, 3, 4, 5)  # PIL's NEAREST, LANCZOS, BILINEAR, BICUBIC, BOX, HAMMING


@dataclass(frozen=True)
class PixelFormat:
    """How resized pixels become patch rows: preprocessor_config.json's `patch_size`, `merge_size`,
    `resample`, `rescale_factor`, `image_mean`, `image_std` (checked where they are read:
    input/vl_processor.py)."""

    patch_size: int = PATCH_SIZE
    merge_size: int = MERGE_SIZE
    resample: int = BICUBIC
    rescale_factor: float = 1 / 255
    image_mean: tuple = CLIP_MEAN
    image_std: tuple = CLIP_STD

    @property
    def factor(self) -> int:
        """Both sides of a resized image are multiples of it (28 by default)."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Values per patch row: 3 * patch_size^2."""
        return 3 * self.patch_size**2


DEFAULT_FORMAT = PixelFormat()


def smart_resize(height: int, width: int, factor: int = FACTOR, min_pixels: int = IMAGE_MIN_PIXELS,
                 max_pixels: int = IMAGE_MAX_PIXELS) -> tuple[int, int]:
    """(height, width) to resize to: multiples of `factor` with h * w in [min_pixels, max_pixels].

    Like transformers, the result may fall just outside the range where rounding to the factor cannot
    meet it (FastDeploy raises then). Raises ValueError for a non-positive side or min_pixels > max_pixels."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got height={height}, width={width}")
    if not 0 < min_pixels <= max_pixels:
        raise ValueError(f"need 0 < min_pixels <= max_pixels, got min_pixels={min_pixels}, max_pixels={max_pixels}")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:  # FastDeploy's clamp
        short = max(factor, round(min(height, width) / factor) * factor)
        long = math.floor(short * MAX_ASPECT_RATIO / factor) * factor
        height, width = (long, short) if height > width else (short, long)
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def to_rgb(image):
    """A PIL RGB image; transparency (an alpha band or a transparent palette colour) composited onto white."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def normalize(pixels: np.ndarray, fmt: PixelFormat = DEFAULT_FORMAT) -> np.ndarray:
    """[..., H, W, 3] uint8 -> [..., 3, H, W] float32 `(x * rescale_factor - mean) / std`."""
    x = (pixels.astype(np.float64) * fmt.rescale_factor).astype(np.float32)
    x = (x - np.asarray(fmt.image_mean, np.float32)) / np.asarray(fmt.image_std, np.float32)
    return np.moveaxis(x, -1, -3)


def patchify(frames: np.ndarray, fmt: PixelFormat = DEFAULT_FORMAT) -> np.ndarray:
    """[t, C, H, W] -> [t * gh * gw, C * p * p] patch rows in merge-block order (gh = H/p, gw = W/p)."""
    t, c, height, width = frames.shape
    m, p = fmt.merge_size, fmt.patch_size
    gh, gw = height // p, width // p
    x = frames.reshape(t, c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 2, 5, 3, 6, 1, 4, 7)  # [t, gh/m, gw/m, m, m, C, p, p]
    return np.ascontiguousarray(x).reshape(t * gh * gw, c * p * p)


def resize_rgb(image, height: int, width: int, resample: int = BICUBIC) -> np.ndarray:
    """[height, width, 3] uint8: `image` in RGB, PIL-resized with filter `resample` (no reducing_gap)."""
    return np.asarray(to_rgb(image).resize((width, height), resample=resample))


def preprocess_image(image, min_pixels: int = IMAGE_MIN_PIXELS, max_pixels: int = IMAGE_MAX_PIXELS,
                     fmt: PixelFormat = DEFAULT_FORMAT) -> tuple[np.ndarray, tuple[int, int, int]]:
    """One PIL image -> (pixel_values [h * w, 3 p^2] float32, grid_thw (1, h, w) in patches of p)."""
    height, width = smart_resize(image.height, image.width, fmt.factor, min_pixels, max_pixels)
    pixels = normalize(resize_rgb(image, height, width, fmt.resample)[None], fmt)  # [1, 3, H, W]
    return patchify(pixels, fmt), (1, height // fmt.patch_size, width // fmt.patch_size)


def preprocess_frames(frames: list, min_pixels: int = VIDEO_MIN_PIXELS, max_pixels: int = VIDEO_MAX_PIXELS,
                      fmt: PixelFormat = DEFAULT_FORMAT) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Video frames (PIL images) -> (pixel_values [t * h * w, 3 p^2] float32, grid_thw (t, h, w)); every
    frame is resized to the size smart_resize gives the first."""
    height, width = smart_resize(frames[0].height, frames[0].width, fmt.factor, min_pixels, max_pixels)
    pixels = normalize(np.stack([resize_rgb(f, height, width, fmt.resample) for f in frames]), fmt)  # [t, 3, H, W]
    return patchify(pixels, fmt), (len(frames), height // fmt.patch_size, width // fmt.patch_size)
