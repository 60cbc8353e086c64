"""The VL input processor on the tiny checkpoint: prompt ids against transformers' placeholder expansion,
M-RoPE positions against transformers' get_rope_index, pixel values against its PIL processor, hashes,
and the errors raised before any work (counts, runs, limits, settings, budget)."""
import json

import numpy as np
import pytest
import torch

from vl_fakes import random_image
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.input.vl_processor import IMAGE_MARKER, VIDEO_MARKER, MultiModalData, VLSettings
from vl_helpers import TOKEN_IDS, color_frames, flat_config, make_processor, write_mp4

IMAGE, VIDEO = TOKEN_IDS["image_token_id"], TOKEN_IDS["video_token_id"]
TINY_VIDEO = {"video_min_pixels": 28 * 28 * 4, "video_max_pixels": 28 * 28 * 6, "video_min_frames": 4,
              "video_fps": 2}


@pytest.fixture(scope="module")
def processor(vl_dir):
    return make_processor(vl_dir, limit_mm_per_prompt={"image": 3, "video": 2}, mm_processor_kwargs=TINY_VIDEO)


@pytest.fixture(scope="module")
def hf_improc():
    from transformers import Ernie4_5_VLMoeImageProcessorPil

    return Ernie4_5_VLMoeImageProcessorPil()


def prompt(*parts):
    return "<|begin_of_sentence|>User: " + "".join(parts) + "\nAssistant: "


def picture(n, marker=IMAGE_MARKER):
    return f"Picture {n}:<|IMAGE_START|>{marker}<|IMAGE_END|>"


def rope_index(hf_model, ids, image_grids=None, video_grids=None):
    """transformers' positions for `ids`: token types derived from the ids themselves."""
    ids_t = torch.tensor([ids])
    types = torch.zeros_like(ids_t)
    types[ids_t == IMAGE] = 1
    types[ids_t == VIDEO] = 2
    grids = {k: torch.tensor(v) for k, v in (("image_grid_thw", image_grids), ("video_grid_thw", video_grids)) if v}
    positions, _ = hf_model.model.get_rope_index(ids_t, types, **grids)
    return positions[:, 0].numpy()


def test_one_image_ids_pixels_positions_against_transformers(processor, vl_hf_model, hf_improc):
    image = random_image(60, 90)
    text = prompt(picture(1), "What is in the picture?")
    out = processor.process(text, None, SamplingParams(max_tokens=4), 0, MultiModalData(image=[image]))
    ref = hf_improc(images=[image], return_tensors="np")
    grid = tuple(int(x) for x in ref["image_grid_thw"][0])
    n = grid[1] * grid[2] // 4
    # oracle ids: transformers' rule, one <|IMAGE_PLACEHOLDER|> repeated grid.prod() // 4 times
    hf_text = text.replace(IMAGE_MARKER, "<|IMAGE_PLACEHOLDER|>")
    single = processor.tokenizer.encode(hf_text, add_special_tokens=False)
    at = single.index(IMAGE)
    expected = single[:at] + [IMAGE] * n + single[at + 1:]
    assert out.prompt_token_ids == expected
    (feature,) = out.mm_features
    assert (feature.modality, feature.offset, feature.length, feature.grid_thw) == ("image", at, n, grid)
    np.testing.assert_array_equal(feature.pixel_values, ref["pixel_values"])
    np.testing.assert_array_equal(out.token_type_ids, (np.asarray(expected) == IMAGE).astype(np.int64))
    np.testing.assert_array_equal(out.positions, rope_index(vl_hf_model, expected, [grid]))
    assert out.positions.shape == (3, len(expected)) and out.positions.dtype == np.int64


@pytest.mark.parametrize("style", ["fd_marker", "hf_token"])
def test_two_images_both_marking_styles(processor, vl_hf_model, style):
    images = [random_image(60, 90, 1), random_image(120, 50, 2)]
    marker = IMAGE_MARKER if style == "fd_marker" else "<|IMAGE_PLACEHOLDER|>"
    text = prompt(picture(1, marker), "and", picture(2, marker), "compare them")
    out = processor.process(text, None, SamplingParams(max_tokens=4), 0, MultiModalData(image=images))
    grids = [f.grid_thw for f in out.mm_features]
    assert [f.length for f in out.mm_features] == [g[1] * g[2] // 4 for g in grids]
    assert out.mm_features[0].offset + out.mm_features[0].length < out.mm_features[1].offset
    np.testing.assert_array_equal(out.positions, rope_index(vl_hf_model, out.prompt_token_ids, grids))


def test_templates_of_both_styles_give_the_same_prompt(vl_dir, vl_dir_hf):
    conversation = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}},
                                                 {"type": "text", "text": "Describe."}]}]
    images = MultiModalData(image=[random_image(50, 50)])
    outs = []
    for directory in (vl_dir, vl_dir_hf):
        proc = make_processor(directory)
        text = proc.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        outs.append(proc.process(text, None, SamplingParams(max_tokens=2), 0, images))
    assert outs[0].prompt_token_ids == outs[1].prompt_token_ids
    np.testing.assert_array_equal(outs[0].positions, outs[1].positions)


def test_expanded_id_prompt_is_accepted(processor):
    image = random_image(56, 56)
    first = processor.process(prompt(picture(1)), None, SamplingParams(max_tokens=2), 0, MultiModalData(image=[image]))
    again = processor.process(None, first.prompt_token_ids, SamplingParams(max_tokens=2), 0, MultiModalData(image=[image]))
    assert again.prompt_token_ids == first.prompt_token_ids
    np.testing.assert_array_equal(again.positions, first.positions)


def test_text_prompt_positions_are_arange_on_three_axes(processor):
    out = processor.process("hello there", None, SamplingParams(max_tokens=2), 0)
    n = len(out.prompt_token_ids)
    np.testing.assert_array_equal(out.positions, np.tile(np.arange(n), (3, 1)))
    assert not out.mm_features and not out.token_type_ids.any()


def test_a_lone_surrogate_is_named_before_the_text_is_tokenized(processor):
    """The VL processor tokenizes text itself (around the image/video markers): a lone surrogate is the
    ValueError naming the prompt, not the tokenizer's bare TypeError."""
    with pytest.raises(ValueError, match=r"prompt 3 holds the lone surrogate U\+D800 at character 6"):
        processor.process(f"hello \ud800 {IMAGE_MARKER}", None, SamplingParams(max_tokens=2), 3)


def test_hashes_follow_pixels(processor):
    a, b = random_image(56, 56, 1), random_image(56, 56, 2)
    hashes = [processor.process(prompt(picture(1)), None, SamplingParams(max_tokens=2), 0,
                                MultiModalData(image=[im])).mm_features[0].mm_hash for im in (a, a.copy(), b)]
    assert hashes[0] == hashes[1] != hashes[2]


@pytest.fixture(scope="module")
def video_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("video") / "v.mp4"
    write_mp4(path, color_frames(8, height=56, width=84), fps=4)  # 2 s
    return path


def test_video_positions_and_tokens(processor, vl_hf_model, video_file):
    text = prompt(f"Video 1:<|VIDEO_START|>{VIDEO_MARKER}<|VIDEO_END|>", "what happens?")
    out = processor.process(text, None, SamplingParams(max_tokens=2), 0, MultiModalData(video=[str(video_file)]))
    (feature,) = out.mm_features
    t, h, w = feature.grid_thw
    # 2 s at 2 fps = 4 frames (min_frames 4); 56x84 fits video pixels [4, 6] x 28^2 -> 2x3 blocks
    assert (t, h, w) == (4, 4, 6) and feature.length == t * h * w // 8 == 12
    assert feature.pixel_values.shape == (t * h * w, 588)
    assert set(out.prompt_token_ids[feature.offset:feature.offset + feature.length]) == {VIDEO}
    assert (out.token_type_ids == 2).sum() == 12
    # t/2 = 2 frame pairs <= max(2, 3): transformers' rule agrees with FastDeploy's here
    np.testing.assert_array_equal(out.positions, rope_index(vl_hf_model, out.prompt_token_ids, None, [(t, h, w)]))


def test_long_video_positions_follow_fastdeploy_after_the_video(processor, tmp_path):
    path = tmp_path / "long.mp4"
    write_mp4(path, color_frames(24, height=56, width=56), fps=4)  # 6 s -> 12 frames -> 6 pairs > 2 blocks
    text = prompt(f"<|VIDEO_START|>{VIDEO_MARKER}<|VIDEO_END|>", "after")
    out = processor.process(text, None, SamplingParams(max_tokens=2), 0, MultiModalData(video=[str(path)]))
    (feature,) = out.mm_features
    assert feature.grid_thw == (12, 4, 4)
    start = int(out.positions[0, feature.offset])
    end = feature.offset + feature.length
    # FastDeploy: the next token is at max(coords) + 1 = start + max(6 pairs, 2 rows, 2 columns)
    np.testing.assert_array_equal(out.positions[:, end], [start + 6] * 3)
    np.testing.assert_array_equal(out.positions[0, feature.offset:end], start + np.repeat(np.arange(6), 4))


def test_video_item_overrides(processor, video_file):
    text = prompt(f"<|VIDEO_START|>{VIDEO_MARKER}<|VIDEO_END|>")
    out = processor.process(text, None, SamplingParams(max_tokens=2), 0,
                            MultiModalData(video=[{"video": video_file.read_bytes(), "fps": 4, "max_frames": 30}]))
    assert out.mm_features[0].grid_thw[0] == 8  # 2 s at 4 fps
    with pytest.raises(ValueError, match="unknown video setting"):
        processor.process(text, None, SamplingParams(max_tokens=2), 0,
                          MultiModalData(video=[{"video": video_file.read_bytes(), "max_frame": 3}]))


@pytest.mark.parametrize("text,data,match", [
    (prompt(picture(1), picture(2)), dict(image=1), "2 image placeholder"),
    (prompt(picture(1)), dict(image=2), "1 image placeholder"),
    (prompt("no picture"), dict(image=1), "0 image placeholder"),
    (prompt(picture(1)), dict(image=0), "1 image placeholder"),
    (prompt(picture(1), picture(2), picture(3), picture(4)), dict(image=4), "Too many image items"),
])
def test_count_errors(processor, text, data, match):
    mm = MultiModalData(image=[random_image(56, 56, i) for i in range(data["image"])])
    with pytest.raises(ValueError, match=match):
        processor.process(text, None, SamplingParams(max_tokens=2), 3, mm)


def test_placeholder_run_of_wrong_length(processor):
    ids = processor.tokenizer.encode("Picture 1:", add_special_tokens=False) + [TOKEN_IDS["image_start_token_id"]]
    ids += [IMAGE] * 3 + [TOKEN_IDS["image_end_token_id"]]
    with pytest.raises(ValueError, match="run of 3 tokens"):
        processor.process(None, ids, SamplingParams(max_tokens=2), 0, MultiModalData(image=[random_image(56, 56)]))


def test_non_image_item_is_a_type_error(processor):
    with pytest.raises(TypeError, match="PIL image"):
        processor.process(prompt(picture(1)), None, SamplingParams(max_tokens=2), 0, MultiModalData(image=["x.png"]))


def test_item_longer_than_the_step_budget(vl_dir):
    proc = make_processor(vl_dir, max_model_len=256, enable_chunked_prefill=True, max_num_batched_tokens=64)
    with pytest.raises(ValueError, match="max_num_batched_tokens=64"):
        proc.process(prompt(picture(1)), None, SamplingParams(max_tokens=2), 0,
                     MultiModalData(image=[random_image(400, 400)]))


@pytest.mark.parametrize("kwargs,match", [
    ({"image_max_pixel": 10}, "unknown key"), ({"video_fps": "2"}, "video_fps"), ({"image_min_pixels": 1.5}, "image_min_pixels"),
    ({"temporal_conv_size": 4}, "temporal_conv_size"), ({"image_min_pixels": 10_000, "image_max_pixels": 100}, "exceeds"),
    ({"video_frames_sample": "rand"}, "frames_sample"), ({"video_max_frames": True}, "video_max_frames"),
])
def test_mm_processor_kwargs_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VLSettings.from_kwargs(kwargs)


def test_mm_processor_kwargs_take_effect(vl_dir):
    proc = make_processor(vl_dir, mm_processor_kwargs={"image_max_pixels": 28 * 28 * 5})
    out = proc.process(prompt(picture(1)), None, SamplingParams(max_tokens=2), 0,
                       MultiModalData(image=[random_image(400, 400)]))
    assert out.mm_features[0].grid_thw == (1, 4, 4) and out.mm_features[0].length == 4


def test_paddle_layout_ids_video_uses_the_image_placeholder(vl_dir, tmp_path, video_file):
    """FastDeploy's -Paddle configs (flat) name `im_patch_id` only: videos take the image placeholder id,
    the delimiters come from the tokenizer, and a placeholder run after <|VIDEO_START|> is a video."""
    import shutil

    paddle_dir = tmp_path / "paddle_style"
    shutil.copytree(vl_dir, paddle_dir)
    config = flat_config(json.loads((paddle_dir / "config.json").read_text()))
    assert config["im_patch_id"] == IMAGE and not set(TOKEN_IDS) & set(config)
    (paddle_dir / "config.json").write_text(json.dumps(config))
    proc = make_processor(paddle_dir, mm_processor_kwargs=TINY_VIDEO)
    ids = proc.token_ids
    assert (ids.image, ids.video, ids.image_start, ids.video_end) == (IMAGE, IMAGE, 6, 10)
    text = prompt(picture(1), f"<|VIDEO_START|>{VIDEO_MARKER}<|VIDEO_END|>")
    data = MultiModalData(image=[random_image(56, 56)], video=[str(video_file)])
    out = proc.process(text, None, SamplingParams(max_tokens=2), 0, data)
    assert [f.modality for f in out.mm_features] == ["image", "video"]
    assert VIDEO not in out.prompt_token_ids and out.token_type_ids.tolist().count(2) == out.mm_features[1].length
    again = proc.process(None, out.prompt_token_ids, SamplingParams(max_tokens=2), 0, data)  # ids: by delimiter
    assert [f.modality for f in again.mm_features] == ["image", "video"]
    np.testing.assert_array_equal(again.positions, out.positions)
