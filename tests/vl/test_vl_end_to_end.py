"""ERNIE-4.5-VL end to end on the tiny checkpoint: LLM.chat with images (the input processor, the scheduler,
the runner and the model) gives transformers' greedy tokens, with transformers fed its own processor's
pixels and its own placeholder expansion; both chat-template styles; one and two images; the examples run
on the model. Vision ids (placeholders, delimiters) are banned on both sides: transformers routes
generated tokens to the text experts whatever their id, the engine by id."""
import numpy as np
import pytest
import torch

from fastdeploy import LLM, SamplingParams
from vl_fakes import random_image
from vl_helpers import TOKEN_IDS

IMAGE = TOKEN_IDS["image_token_id"]
VISION_IDS = sorted(TOKEN_IDS.values())
NEW_TOKENS = 10


def hf_greedy(hf_model, text, images, tokenizer):
    """transformers' tokens: its PIL image processor, its expansion of <|IMAGE_PLACEHOLDER|>, its generate."""
    from transformers import Ernie4_5_VLMoeImageProcessorPil

    pixels = Ernie4_5_VLMoeImageProcessorPil()(images=images, return_tensors="pt")
    ids = tokenizer.encode(text.replace("<|image@placeholder|>", "<|IMAGE_PLACEHOLDER|>"), add_special_tokens=False)
    expanded, grids = [], iter(pixels["image_grid_thw"].tolist())
    for token in ids:
        expanded += [token] * (np.prod(next(grids)) // 4 if token == IMAGE else 1)
    input_ids = torch.tensor([expanded])
    hf_model.model.rope_deltas = None
    with torch.no_grad():
        out = hf_model.generate(input_ids=input_ids, pixel_values=pixels["pixel_values"],
                                image_grid_thw=pixels["image_grid_thw"], mm_token_type_ids=(input_ids == IMAGE).int(),
                                moe_mm_token_type_ids=torch.isin(input_ids, torch.tensor(VISION_IDS)).int(),
                                do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                suppress_tokens=VISION_IDS)
    hf_model.model.rope_deltas = None
    return expanded, out[0, len(expanded):].tolist()


@pytest.fixture(scope="module")
def engines(vl_dir, vl_dir_hf):
    kwargs = dict(max_model_len=512, block_size=16, num_gpu_blocks_override=64, max_num_seqs=4,
                  limit_mm_per_prompt={"image": 2})
    llms = {"fd": LLM(model=str(vl_dir), **kwargs), "hf": LLM(model=str(vl_dir_hf), **kwargs)}
    yield llms
    for llm in llms.values():
        llm.shutdown()


@pytest.mark.parametrize("style", ["fd", "hf"])
@pytest.mark.parametrize("num_images", [1, 2])
def test_chat_greedy_equals_transformers(engines, vl_hf_model, tmp_path, style, num_images):
    llm = engines[style]
    images = [random_image(60 + 30 * k, 90 - 20 * k, seed=k) for k in range(num_images)]
    paths = []
    for k, image in enumerate(images):
        image.save(tmp_path / f"{k}.png")
        paths.append(str(tmp_path / f"{k}.png"))
    conversation = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": p}} for p in paths]
                     + [{"type": "text", "text": "Describe the picture in detail."}]}]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, bad_words_token_ids=VISION_IDS)
    out = llm.chat(conversation, params, use_tqdm=False)[0]
    fd_text = out.prompt.replace("<|IMAGE_PLACEHOLDER|>", "<|image@placeholder|>")
    ids, expected = hf_greedy(vl_hf_model, fd_text, images, llm.get_tokenizer())
    assert out.prompt_token_ids == ids
    assert out.outputs.token_ids == expected
    assert len(set(expected)) > 2


def test_video_greedy_equals_transformers_fed_the_engines_frames(vl_dir, vl_hf_model, tmp_path):
    """transformers' model on the engine's sampled, timestamped, resized frames (its video processor needs
    torchvision); 2 frame pairs <= max(2, 3) blocks, where both position rules agree."""
    from fastdeploy.input.vl_processor import MultiModalData
    from vl_helpers import color_frames, write_mp4

    path = tmp_path / "v.mp4"
    write_mp4(path, color_frames(8, height=56, width=84), fps=4)
    video_kwargs = {"video_min_pixels": 28 * 28 * 4, "video_max_pixels": 28 * 28 * 6, "video_min_frames": 4}
    llm = LLM(model=str(vl_dir), max_model_len=256, block_size=16, num_gpu_blocks_override=32,
              mm_processor_kwargs=video_kwargs)
    text = "<|begin_of_sentence|>User: Video 1:<|VIDEO_START|><|video@placeholder|><|VIDEO_END|>What happens?\nAssistant: "
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, bad_words_token_ids=VISION_IDS)
    out = llm.generate({"prompt": text, "multimodal_data": {"video": [str(path)]}}, params, use_tqdm=False)[0]
    (feature,) = llm.llm_engine.input_processor.process(text, None, params, 0,
                                                        MultiModalData(video=[str(path)])).mm_features
    assert feature.grid_thw == (4, 4, 6) and out.num_input_video_tokens == 12
    video = TOKEN_IDS["video_token_id"]
    ids = llm.get_tokenizer().encode(text.replace("<|video@placeholder|>", "<|VIDEO_PLACEHOLDER|>"),
                                     add_special_tokens=False)
    at = ids.index(video)
    ids = ids[:at] + [video] * 12 + ids[at + 1:]
    assert out.prompt_token_ids == ids
    input_ids = torch.tensor([ids])
    delimiters = [TOKEN_IDS["video_start_token_id"], TOKEN_IDS["video_end_token_id"], video]
    vl_hf_model.model.rope_deltas = None
    with torch.no_grad():
        ref = vl_hf_model.generate(
            input_ids=input_ids, pixel_values_videos=torch.tensor(feature.pixel_values),
            video_grid_thw=torch.tensor([feature.grid_thw]), mm_token_type_ids=(input_ids == video).int() * 2,
            moe_mm_token_type_ids=torch.isin(input_ids, torch.tensor(delimiters)).int() * 2, do_sample=False,
            max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, suppress_tokens=VISION_IDS)
    vl_hf_model.model.rope_deltas = None
    assert out.outputs.token_ids == ref[0, len(ids):].tolist()
    llm.shutdown()
