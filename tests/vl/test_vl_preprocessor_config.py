"""The checkpoint's preprocessor_config.json: a tiny checkpoint whose file differs from every built-in
default (patch 16, merge 3, pixel range, resample, rescale factor, mean, std, video keys), in both key
styles, against transformers' processor on the same directory (pixel values, grid, prompt ids) and on
the model (greedy tokens); mm_processor_kwargs over the file; malformed values; processor and vision
tower disagreeing.
transformers reads only its own style (`size`, `merge_size`): the FastDeploy-style file is checked
against transformers on the transformers-style file holding the same values. transformers has no video
settings in this file (and its video processor needs torchvision): the video keys are checked against
the frame indices FastDeploy's rule gives and transformers' image processor on the sampled frames."""
import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from fastdeploy import LLM, SamplingParams
from fastdeploy.input.image_processor import DEFAULT_FORMAT
from fastdeploy.input.video_processor import VideoSampling, sample_video
from fastdeploy.input.vl_processor import MultiModalData
from fastdeploy.input.vl_settings import VLSettings
from vl_fakes import random_image
from vl_helpers import (CUSTOM_MIN_PIXELS, CUSTOM_VISION, PREPROCESSOR_STYLES, TOKEN_IDS,
                        build_tiny_vl, color_frames, hf_image_processor_pipeline, load_hf_model, make_processor,
                        write_mp4, write_preprocessor_config)

IMAGE, VIDEO = TOKEN_IDS["image_token_id"], TOKEN_IDS["video_token_id"]
VISION_IDS = sorted(TOKEN_IDS.values())
PROMPT = ("<|begin_of_sentence|>User: Picture 1:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>What is it?"
          "\nAssistant: ")


@pytest.fixture(scope="module")
def custom_dirs(tmp_path_factory):
    """{"hf": ..., "fd": ...}: the tiny checkpoint with a patch-16, merge-3 vision tower and the custom
    preprocessor_config.json in transformers' and in FastDeploy's key style."""
    hf = build_tiny_vl(tmp_path_factory.mktemp("custom_hf"), template="hf", vision_overrides=CUSTOM_VISION)
    write_preprocessor_config(hf, "hf")
    fd = tmp_path_factory.mktemp("custom_fd")
    shutil.copytree(hf, fd, dirs_exist_ok=True)
    write_preprocessor_config(fd, "fd")
    return {"hf": hf, "fd": fd}


def test_both_key_styles_read_the_same_non_default_settings(custom_dirs):
    hf, fd = VLSettings.load(custom_dirs["hf"]), VLSettings.load(custom_dirs["fd"])
    assert hf == fd
    default = VLSettings()
    for name in ("image_min_pixels", "image_max_pixels", "video_min_pixels", "video_max_pixels"):
        assert getattr(hf, name) != getattr(default, name), name
    for f in dataclasses.fields(DEFAULT_FORMAT):
        assert getattr(hf.pixels, f.name) != getattr(DEFAULT_FORMAT, f.name), f.name
    for f in dataclasses.fields(VideoSampling):
        if f.name != "target_frames":  # set apart below: it switches fps sampling off
            assert getattr(hf.video, f.name) != getattr(default.video, f.name), f.name
    assert hf.source("merge_size").endswith("key 'merge_size'")
    assert fd.source("merge_size").endswith("key 'spatial_conv_size'")
    assert VLSettings.load(custom_dirs["hf"].parent / "no_such_dir") == default  # no file: the defaults


@pytest.mark.parametrize("style", ["hf", "fd"])
@pytest.mark.parametrize("height,width", [(100, 150), (30, 500), (700, 400), (61, 47)])
def test_pixels_grid_and_prompt_ids_equal_transformers(custom_dirs, style, height, width):
    image = random_image(height, width, seed=height)
    ours = make_processor(custom_dirs[style]).process(PROMPT, None, SamplingParams(max_tokens=2), 0,
                                                      MultiModalData(image=[image]))
    ref = hf_image_processor_pipeline(custom_dirs["hf"])(images=[image], text=[PROMPT], return_tensors="np")
    (feature,) = ours.mm_features
    assert feature.grid_thw == tuple(int(v) for v in ref["image_grid_thw"][0])
    assert feature.pixel_values.shape[1] == 3 * 16 * 16
    np.testing.assert_array_equal(feature.pixel_values, ref["pixel_values"])
    assert ours.prompt_token_ids == ref["input_ids"][0].tolist()
    assert feature.length == int((ref["input_ids"][0] == IMAGE).sum()) == np.prod(feature.grid_thw) // 9


def test_size_wins_over_flat_keys_as_in_transformers(custom_dirs, tmp_path):
    shutil.copytree(custom_dirs["hf"], tmp_path, dirs_exist_ok=True)
    write_preprocessor_config(tmp_path, "hf", min_pixels=48 * 48 * 6, max_pixels=48 * 48 * 7)
    image = random_image(100, 150)
    ours = make_processor(tmp_path).process(PROMPT, None, SamplingParams(max_tokens=2), 0,
                                            MultiModalData(image=[image]))
    ref = hf_image_processor_pipeline(tmp_path)(images=[image], text=[PROMPT], return_tensors="np")
    assert ours.mm_features[0].grid_thw == tuple(int(v) for v in ref["image_grid_thw"][0]) == (1, 6, 9)


@pytest.mark.parametrize("style", ["hf", "fd"])
def test_mm_processor_kwargs_override_the_file(custom_dirs, style):
    kwargs = {"image_max_pixels": 48 * 48 * 4, "image_mean": [0.1, 0.2, 0.3], "image_std": [0.3, 0.3, 0.3],
              "resample": 0, "rescale_factor": 1 / 255}
    image = random_image(200, 300)
    proc = make_processor(custom_dirs[style], mm_processor_kwargs=kwargs)
    assert proc.settings.source("resample") == "mm_processor_kwargs['resample']"
    ours = proc.process(PROMPT, None, SamplingParams(max_tokens=2), 0, MultiModalData(image=[image]))
    hf_kwargs = {"size": {"shortest_edge": CUSTOM_MIN_PIXELS, "longest_edge": 48 * 48 * 4},
                 "image_mean": [0.1, 0.2, 0.3], "image_std": [0.3, 0.3, 0.3], "resample": 0, "rescale_factor": 1 / 255}
    hf = hf_image_processor_pipeline(custom_dirs["hf"], **hf_kwargs)
    ref = hf(images=[image], text=[PROMPT], return_tensors="np")
    (feature,) = ours.mm_features
    assert feature.grid_thw == tuple(int(v) for v in ref["image_grid_thw"][0]) == (1, 3, 6)  # the file: (1, 6, 9)
    np.testing.assert_array_equal(feature.pixel_values, ref["pixel_values"])
    assert ours.prompt_token_ids == ref["input_ids"][0].tolist()


@pytest.fixture(scope="module")
def video_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("video") / "v.mp4"
    write_mp4(path, color_frames(8, height=56, width=84), fps=4)  # 2 s, frame i's red channel: 37 i mod 256
    return path


@pytest.mark.parametrize("style", ["hf", "fd"])
def test_video_keys_of_the_file(custom_dirs, video_file, style):
    from transformers import Ernie4_5_VLMoeImageProcessorPil

    proc = make_processor(custom_dirs[style], mm_processor_kwargs={})
    text = "<|begin_of_sentence|>User: <|VIDEO_START|><|VIDEO_PLACEHOLDER|><|VIDEO_END|>\nAssistant: "
    out = proc.process(text, None, SamplingParams(max_tokens=2), 0, MultiModalData(video=[str(video_file)]))
    (feature,) = out.mm_features
    # FastDeploy's rule at the file's 3 fps, "middle": int(2 s * 3) = 6 frames in [4, 10] -> fps sampling,
    # the middles of 1/3 s clips at 4 fps video: round([1/6, 1/2, 5/6, 7/6, 3/2, 11/6] * 4)
    expected = np.around((np.arange(6) / 3 + 1 / 6) * 4).astype(int)
    frames = sample_video(str(video_file), proc.settings.video)
    red = [int(np.asarray(f)[-1, -1, 0]) for f in frames]  # bottom-right: clear of the timestamp
    assert red == [(i * 37) % 256 for i in expected]
    # 56 x 84 at factor 48 -> 48 x 96 (video pixels [2, 4] x 48^2) -> grid (6, 3, 6): 3 pairs x 1 x 2 blocks
    assert feature.grid_thw == (6, 3, 6) and feature.length == 6
    assert (np.asarray(out.prompt_token_ids) == VIDEO).sum() == 6
    style_file = PREPROCESSOR_STYLES["hf"]
    ref = Ernie4_5_VLMoeImageProcessorPil.from_pretrained(
        custom_dirs["hf"], size={"shortest_edge": style_file["video_min_pixels"],
                                 "longest_edge": style_file["video_max_pixels"]})(images=frames, return_tensors="np")
    np.testing.assert_array_equal(feature.pixel_values, ref["pixel_values"])


def test_video_target_frames_of_the_file(custom_dirs, video_file, tmp_path):
    shutil.copytree(custom_dirs["fd"], tmp_path, dirs_exist_ok=True)
    write_preprocessor_config(tmp_path, "fd", video_target_frames=4, video_frames_sample="leading")
    proc = make_processor(tmp_path)
    frames = sample_video(str(video_file), proc.settings.video)
    # 4 evenly spaced "leading" frames of 8: linspace(0, 8, 5) -> 0, 2, 4, 6
    assert [int(np.asarray(f)[-1, -1, 0]) for f in frames] == [(i * 37) % 256 for i in (0, 2, 4, 6)]


@pytest.mark.parametrize("entries,key,value", [
    ({"patch_size": "16"}, "patch_size", "'16'"),
    ({"merge_size": 0}, "merge_size", "0"),
    ({"size": {"height": 224, "width": 224}}, "size", "{'height': 224, 'width': 224}"),
    ({"size": {"shortest_edge": -5, "longest_edge": 100}}, "size.shortest_edge", "-5"),
    ({"min_pixels": 1.5}, "min_pixels", "1.5"),
    ({"image_mean": [0.5, 0.5]}, "image_mean", "[0.5, 0.5]"),
    ({"image_std": [0.2, 0, 0.3]}, "image_std", "[0.2, 0, 0.3]"),
    ({"resample": 9}, "resample", "9"),
    ({"rescale_factor": -1}, "rescale_factor", "-1"),
    ({"temporal_conv_size": 3}, "temporal_conv_size", "3"),
    ({"do_normalize": False}, "do_normalize", "False"),
    ({"video_fps": "2"}, "video_fps", "'2'"),
    ({"video_frames_sample": "rand"}, "video_frames_sample", "rand"),
    ({"spatial_conv_size": 2}, "spatial_conv_size", "2"),  # merge_size 3 in the same file
    ({"min_pixels": 10_000, "max_pixels": 100, "size": None}, "max_pixels", "100"),
])
def test_malformed_values_name_the_file_key_and_value(tmp_path, entries, key, value):
    data = {**PREPROCESSOR_STYLES["hf"], **entries}
    if data.get("size") is None:
        data.pop("size")
    path = tmp_path / "preprocessor_config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as error:
        VLSettings.load(tmp_path)
    message = str(error.value)
    assert str(path) in message and key in message and value in message, message


def test_unreadable_file_is_a_value_error(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="preprocessor_config.json"):
        VLSettings.load(tmp_path)


def test_processor_and_vision_tower_must_agree(vl_dir, custom_dirs, tmp_path):
    shutil.copytree(vl_dir, tmp_path, dirs_exist_ok=True)  # vision: patch 14, merge 2
    write_preprocessor_config(tmp_path, "hf")
    with pytest.raises(ValueError, match=r"patch_size=16 \(.*preprocessor_config.json key 'patch_size'\) differs "
                                         r"from config.json's vision patch_size=14"):
        make_processor(tmp_path)
    with pytest.raises(ValueError, match=r"merge_size=2 \(mm_processor_kwargs\['spatial_conv_size'\]\) differs "
                                         r"from config.json's vision spatial_merge_size=3"):
        make_processor(custom_dirs["fd"], mm_processor_kwargs={"spatial_conv_size": 2})
    with pytest.raises(ValueError, match=r"merge_size=3 \(mm_processor_kwargs.*spatial_merge_size=2"):
        LLM(model=str(vl_dir), max_model_len=256, num_gpu_blocks_override=32, block_size=16,
            mm_processor_kwargs={"spatial_conv_size": 3})


def test_greedy_tokens_equal_transformers_on_the_custom_checkpoint(custom_dirs):
    """The whole engine (processor, patch-16 merge-3 vision tower, resampler, M-RoPE) against transformers'
    model fed its own processor's output on the same directory."""
    torch.set_num_threads(1)
    image = random_image(130, 170, seed=3)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, bad_words_token_ids=VISION_IDS)
    llm = LLM(model=str(custom_dirs["fd"]), max_model_len=256, num_gpu_blocks_override=32, block_size=16)
    out = llm.generate({"prompt": PROMPT, "multimodal_data": {"image": [image]}}, params, use_tqdm=False)[0]
    llm.shutdown()
    ref = hf_image_processor_pipeline(custom_dirs["hf"])(images=[image], text=[PROMPT], return_tensors="pt")
    ids = ref["input_ids"]
    assert out.prompt_token_ids == ids[0].tolist()
    model = load_hf_model(custom_dirs["hf"])
    with torch.no_grad():
        tokens = model.generate(input_ids=ids, pixel_values=ref["pixel_values"], image_grid_thw=ref["image_grid_thw"],
                                mm_token_type_ids=(ids == IMAGE).int(),
                                moe_mm_token_type_ids=torch.isin(ids, torch.tensor(VISION_IDS)).int(),
                                do_sample=False, max_new_tokens=8, min_new_tokens=8, suppress_tokens=VISION_IDS)
    expected = tokens[0, ids.shape[1]:].tolist()
    assert out.outputs.token_ids == expected and len(set(expected)) > 2
