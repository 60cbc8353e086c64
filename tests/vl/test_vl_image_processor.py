"""ERNIE-4.5-VL image preprocessing against transformers' PIL image processor (the oracle), bit for bit."""
import numpy as np
import pytest
from PIL import Image

from fastdeploy.input.image_processor import (IMAGE_MAX_PIXELS, IMAGE_MIN_PIXELS, preprocess_frames,
                                              preprocess_image, smart_resize)


@pytest.fixture(scope="module")
def hf_processor():
    from transformers import Ernie4_5_VLMoeImageProcessorPil

    return Ernie4_5_VLMoeImageProcessorPil()


def random_image(height, width, mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    array = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(array[..., 0] if mode == "L" else array, mode)


@pytest.mark.parametrize("height,width", [(60, 90), (10, 10), (28, 28), (41, 97), (300, 17), (224, 224),
                                          (1080, 1920), (4000, 3000), (13, 2000)])
def test_smart_resize_matches_transformers(height, width):
    from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import smart_resize as hf_resize

    assert smart_resize(height, width) == hf_resize(height, width, 28, IMAGE_MIN_PIXELS, IMAGE_MAX_PIXELS)


def test_smart_resize_examples_and_banker_rounding():
    # round(1.5) == 2 and round(2.5) == 2 in Python: 42/28 = 1.5 -> 56, 70/28 = 2.5 -> 56
    assert smart_resize(42, 70, min_pixels=28 * 28) == (56, 56)
    assert smart_resize(60, 90) == (56, 84)
    assert smart_resize(10, 10) == (56, 56)
    assert smart_resize(1080, 1920) == (1092, 1932)
    assert smart_resize(4000, 3000) == (2520, 1904)


def test_aspect_ratio_over_200_is_clamped_as_fastdeploy_does():
    # transformers raises; FastDeploy keeps the short side and clamps the long side to 200x it
    height, width = smart_resize(28, 28 * 300)
    assert (height, width) == (28, 28 * 200 // 28 * 28)
    assert smart_resize(28 * 300, 28) == (28 * 200, 28)


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="positive"):
        smart_resize(0, 10)
    with pytest.raises(ValueError, match="min_pixels"):
        smart_resize(10, 10, min_pixels=100, max_pixels=10)
    # no multiple of 28 fits [1, 100] pixels: transformers (and we) give the smallest, 28 x 28
    assert smart_resize(100, 100, min_pixels=1, max_pixels=100) == (28, 28)


@pytest.mark.parametrize("height,width,mode", [(60, 90, "RGB"), (10, 10, "RGB"), (97, 41, "RGB"),
                                               (333, 500, "RGB"), (1080, 1920, "RGB"), (50, 70, "RGBA"),
                                               (64, 48, "L")])
def test_pixel_values_bit_equal_to_transformers(hf_processor, height, width, mode):
    image = random_image(height, width, mode)
    ours, grid = preprocess_image(image)
    ref = hf_processor(images=[image], return_tensors="np")
    assert ours.dtype == np.float32 and ours.shape[1] == 588
    assert grid == tuple(ref["image_grid_thw"][0])
    np.testing.assert_array_equal(ours, ref["pixel_values"])


def test_palette_with_transparency_bit_equal(hf_processor):
    image = random_image(40, 60).convert("P")
    image.info["transparency"] = 0
    np.testing.assert_array_equal(preprocess_image(image)[0], hf_processor(images=[image], return_tensors="np")["pixel_values"])


def test_min_max_pixels_as_transformers_size(hf_processor):
    from transformers import Ernie4_5_VLMoeImageProcessorPil

    small = Ernie4_5_VLMoeImageProcessorPil(size={"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 20})
    image = random_image(500, 300)
    ours, grid = preprocess_image(image, min_pixels=28 * 28, max_pixels=28 * 28 * 20)
    ref = small(images=[image], return_tensors="np")
    assert grid == tuple(ref["image_grid_thw"][0]) and grid[1] * grid[2] <= 20 * 4
    np.testing.assert_array_equal(ours, ref["pixel_values"])


def test_video_frames_are_images_stacked_frame_major(hf_processor):
    # each frame is processed as an image at the first frame's size; rows are frame-major
    frames = [random_image(60, 90, seed=s) for s in range(4)]
    ours, grid = preprocess_frames(frames, min_pixels=IMAGE_MIN_PIXELS, max_pixels=IMAGE_MAX_PIXELS)
    ref = hf_processor(images=frames, return_tensors="np")
    assert grid == (4, 4, 6)
    np.testing.assert_array_equal(ours, ref["pixel_values"])


def test_merge_block_order_against_numpy_reference():
    # independent formula: row r of a frame is patch (bh*2 + i, bw*2 + j) for r = ((bh*gw/2 + bw)*2 + i)*2 + j
    image = random_image(56, 84)
    ours, (_, gh, gw) = preprocess_image(image)
    from fastdeploy.input.image_processor import normalize, resize_rgb

    chw = normalize(resize_rgb(image, 56, 84))
    for r in range(gh * gw):
        block, within = divmod(r, 4)
        bh, bw = divmod(block, gw // 2)
        i, j = divmod(within, 2)
        y, x = (bh * 2 + i) * 14, (bw * 2 + j) * 14
        np.testing.assert_array_equal(ours[r], chw[:, y:y + 14, x:x + 14].reshape(-1))
