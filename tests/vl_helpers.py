"""A tiny random ERNIE-4.5-VL checkpoint built by transformers, shared by the VL tests (input side and model).

`build_tiny_vl(directory, template="fd")` writes an HF-layout directory (`save_pretrained` of
`Ernie4_5_VLMoeForConditionalGeneration`: nested config.json, model.safetensors in the original PT key
layout) with a byte-level BPE tokenizer holding ERNIE-4.5-VL's special tokens (ids 0..12, below) and a
chat template:
  - "fd": FastDeploy/Paddle style: an image part renders `Picture n:<|IMAGE_START|><|image@placeholder|>
    <|IMAGE_END|>`, a video part `Video n:<|VIDEO_START|><|video@placeholder|><|VIDEO_END|>`;
  - "hf": transformers' style: a single `<|IMAGE_PLACEHOLDER|>` / `<|VIDEO_PLACEHOLDER|>` inside the
    START/END tokens (the processor expands it).
Both end with `\\nAssistant: ` and `<think>\\n\\n</think>\\n\\n` unless `enable_thinking` is true
(then `<think>\\n`).
Norm weights, biases and MoE correction biases are randomised so that a wrong routing or a dropped
bias shows in the logits. `vision_overrides` change the vision tower (e.g. CUSTOM_VISION, patch 16 and
merge 3), and `write_preprocessor_config` adds a preprocessor_config.json that differs from every
built-in default, in transformers' or FastDeploy's key style.
"""
from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<unk>", "<s>", "</s>", "<|begin_of_sentence|>", "<|end_of_sentence|>", "<|IMAGE_PLACEHOLDER|>",
            "<|IMAGE_START|>", "<|IMAGE_END|>", "<|VIDEO_PLACEHOLDER|>", "<|VIDEO_START|>", "<|VIDEO_END|>",
            "<think>", "</think>"]
TOKEN_IDS = dict(image_token_id=5, image_start_token_id=6, image_end_token_id=7, video_token_id=8,
                 video_start_token_id=9, video_end_token_id=10)
VOCAB_SIZE = 512
CORPUS = ["User: What is in the picture? Describe the image and the video in detail.",
          "Assistant: A cat sits on a red chair next to a window. The video shows a dog running.",
          "Picture 1: Video 2: time: 00:00:01.50 what colour, which animal, how many frames?",
          "The quick brown fox jumps over the lazy dog. 0123456789 abcdefghijklmnopqrstuvwxyz"]

_HEAD = (
    "{%- if not add_generation_prompt is defined -%}{%- set add_generation_prompt = true -%}{%- endif -%}"
    "{{- '<|begin_of_sentence|>' -}}"
    "{%- set image_count = namespace(value=0) -%}{%- set video_count = namespace(value=0) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{- 'User: ' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- 'Assistant: ' -}}{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('image', 'image_url') -%}{%- set image_count.value = image_count.value + 1 -%}"
)
_IMAGE = {"fd": "{{- 'Picture ' ~ image_count.value ~ ':<|IMAGE_START|><|image@placeholder|><|IMAGE_END|>' -}}",
          "hf": "{{- 'Picture ' ~ image_count.value ~ ':<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>' -}}"}
_VIDEO = {"fd": "{{- 'Video ' ~ video_count.value ~ ':<|VIDEO_START|><|video@placeholder|><|VIDEO_END|>' -}}",
          "hf": "{{- 'Video ' ~ video_count.value ~ ':<|VIDEO_START|><|VIDEO_PLACEHOLDER|><|VIDEO_END|>' -}}"}
_TAIL = (
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{{- '<|end_of_sentence|>' -}}{%- else -%}{{- '\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '\\nAssistant: ' -}}"
    "{%- if enable_thinking is defined and enable_thinking -%}{{- '<think>\\n' -}}"
    "{%- else -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)


def chat_template(style: str) -> str:
    """The tiny checkpoint's chat template in `style` "fd" or "hf" (see the module docstring)."""
    video = "{%- elif part['type'] in ('video', 'video_url') -%}{%- set video_count.value = video_count.value + 1 -%}"
    return _HEAD + _IMAGE[style] + video + _VIDEO[style] + _TAIL


def build_tokenizer(template: str = "fd"):
    """A transformers PreTrainedTokenizerFast (byte-level BPE, VOCAB_SIZE at most) with the VL specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - 64, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(CORPUS * 10, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        extra_special_tokens={"image_token": "<|IMAGE_PLACEHOLDER|>", "image_start_token": "<|IMAGE_START|>",
                              "image_end_token": "<|IMAGE_END|>", "video_token": "<|VIDEO_PLACEHOLDER|>",
                              "video_start_token": "<|VIDEO_START|>", "video_end_token": "<|VIDEO_END|>"},
    )
    tokenizer.chat_template = chat_template(template)
    for name, token_id in TOKEN_IDS.items():
        assert tokenizer.convert_tokens_to_ids(SPECIALS[token_id]) == token_id, name
    return tokenizer


def tiny_vl_config(vision_overrides=None, **text_overrides):
    """transformers' Ernie4_5_VLMoeConfig of the tiny model (2 text layers: dense then sparse);
    vision_overrides: vision_config keys (e.g. patch_size, spatial_merge_size)."""
    from transformers import Ernie4_5_VLMoeConfig

    text = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": [3, 3, 2]},
                moe_intermediate_size=[32, 16], moe_k=2, moe_num_experts=4, moe_num_shared_experts=1,
                mlp_layer_types=["dense", "sparse"], initializer_range=0.2, eos_token_id=2, bos_token_id=1,
                pad_token_id=0)
    text.update(text_overrides)
    vision = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=14,
                  spatial_merge_size=2, temporal_merge_size=2, initializer_range=0.2)
    vision.update(vision_overrides or {})
    return Ernie4_5_VLMoeConfig(text_config=text, vision_config=vision, **TOKEN_IDS)


def build_tiny_vl(directory, template: str = "fd", seed: int = 0, vision_overrides=None) -> Path:
    """Write the tiny random checkpoint (model + tokenizer + template) to `directory`; returns it."""
    import torch
    from transformers import Ernie4_5_VLMoeForConditionalGeneration

    directory = Path(directory)
    torch.manual_seed(seed)
    model = Ernie4_5_VLMoeForConditionalGeneration(tiny_vl_config(vision_overrides)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name or name.endswith((".ln.weight", "correction_bias")):
                param.copy_(torch.randn_like(param) * 0.3 + (1.0 if name.endswith("weight") else 0.0))
        for name, buffer in model.named_buffers():
            if "correction_bias" in name:
                buffer.copy_(torch.randn_like(buffer) * 0.3)
    model.save_pretrained(directory)
    build_tokenizer(template).save_pretrained(directory)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "bos_token_id": 1}))
    return directory


def load_hf_model(directory):
    """transformers' model on the same checkpoint, float32, eval (the oracle)."""
    import torch
    from transformers import Ernie4_5_VLMoeForConditionalGeneration

    return Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()


def color_frames(num_frames: int, height: int = 48, width: int = 64):
    """[num_frames, height, width, 3] uint8: frame i is a flat colour that encodes i, plus a gradient."""
    import numpy as np

    frames = np.zeros((num_frames, height, width, 3), dtype=np.uint8)
    for i in range(num_frames):
        frames[i, ..., 0] = (i * 37) % 256
        frames[i, ..., 1] = np.arange(width, dtype=np.uint8)[None, :] * 3
        frames[i, ..., 2] = np.arange(height, dtype=np.uint8)[:, None] * 5
    return frames


def write_mp4(path, frames, fps: float) -> bytes:
    """Encode [n, H, W, 3] uint8 frames as a lossless H.264 (RGB) mp4 with imageio-ffmpeg's ffmpeg; returns
    the file's bytes."""
    import subprocess

    import imageio_ffmpeg

    n, height, width, _ = frames.shape
    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt",
                    "rgb24", "-s", f"{width}x{height}", "-r", str(fps), "-i", "-", "-c:v", "libx264rgb", "-qp", "0",
                    str(path)], input=frames.tobytes(), check=True, timeout=60)
    return Path(path).read_bytes()


def flat_config(hf: dict) -> dict:
    """The nested config.json `hf` of build_tiny_vl as FastDeploy's flat Paddle-layout config: text keys at
    the top level, `im_patch_id` and no other token id (FastDeploy reads the delimiters from the
    tokenizer), FastDeploy's MoE, M-RoPE and vision keys (model_executor/test_ernie4_5_vl_checkpoints.py)."""
    text, vision = hf["text_config"], hf["vision_config"]
    keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "use_bias", "moe_k",
            "moe_num_shared_experts", "moe_norm_min"]
    config = {k: text[k] for k in keys}
    sparse = [i for i, t in enumerate(text["mlp_layer_types"]) if t == "sparse"]
    config.update(
        architectures=hf["architectures"], dtype="float32", tie_word_embeddings=hf["tie_word_embeddings"],
        rope_theta=text["rope_parameters"]["rope_theta"], freq_allocation=text["rope_parameters"]["mrope_section"][2],
        moe_num_experts=[text["moe_num_experts"]] * 2, moe_intermediate_size=text["moe_intermediate_size"],
        moe_layer_start_index=sparse[0], moe_layer_end_index=[sparse[-1], sparse[-1]], moe_layer_interval=1,
        moe_use_aux_free=True, im_patch_id=hf["image_token_id"], spatial_conv_size=vision["spatial_merge_size"],
        temporal_conv_size=vision["temporal_merge_size"],
        vision_config=dict(depth=vision["depth"], embed_dim=vision["hidden_size"], num_heads=vision["num_heads"],
                           mlp_ratio=vision["intermediate_size"] / vision["hidden_size"],
                           hidden_act=vision["hidden_act"], patch_size=vision["patch_size"],
                           in_channels=vision["in_channels"], spatial_merge_size=vision["spatial_merge_size"]))
    return config


# A preprocessor_config.json whose every value differs from the built-in defaults (patch 14, merge 2,
# image pixels [4, 6177] x 28^2, BICUBIC, 1/255, CLIP mean/std, video pixels [299, 1196] x 28^2,
# 2 fps, 16-180 frames, "leading"), in both key styles; the checkpoint's vision tower must match
# (CUSTOM_VISION).
CUSTOM_VISION = {"patch_size": 16, "spatial_merge_size": 3}
CUSTOM_COMMON = {"patch_size": 16, "resample": 2, "rescale_factor": 1 / 200, "image_mean": [0.5, 0.4, 0.3],
                 "image_std": [0.2, 0.25, 0.3], "video_min_pixels": 48 * 48 * 2, "video_max_pixels": 48 * 48 * 4,
                 "video_fps": 3, "video_min_frames": 4, "video_max_frames": 10, "video_frames_sample": "middle"}
CUSTOM_MIN_PIXELS, CUSTOM_MAX_PIXELS = 48 * 48 * 2, 48 * 48 * 9
PREPROCESSOR_STYLES = {
    "hf": {"image_processor_type": "Ernie4_5_VLMoeImageProcessorPil", "merge_size": 3, "temporal_patch_size": 1,
           "size": {"shortest_edge": CUSTOM_MIN_PIXELS, "longest_edge": CUSTOM_MAX_PIXELS}, "do_resize": True,
           "do_normalize": True, **CUSTOM_COMMON},
    "fd": {"image_processor_type": "AdaptiveImageProcessor", "spatial_conv_size": 3, "temporal_conv_size": 2,
           "min_pixels": CUSTOM_MIN_PIXELS, "max_pixels": CUSTOM_MAX_PIXELS, **CUSTOM_COMMON},
}


def write_preprocessor_config(directory, style: str, **changes) -> Path:
    """Write PREPROCESSOR_STYLES[style] (with `changes`) as `directory`/preprocessor_config.json; returns the path."""
    path = Path(directory) / "preprocessor_config.json"
    path.write_text(json.dumps({**PREPROCESSOR_STYLES[style], **changes}))
    return path


def make_processor(model_dir, **kwargs):
    """Our VLInputProcessor on checkpoint `model_dir`, built as the engine builds it (LLM keyword `kwargs`)."""
    from fastdeploy.cache_manager.kv_cache_sizing import size_kv_cache
    from fastdeploy.engine.args_utils import EngineArgs
    from fastdeploy.input.tokenizer_loader import load_model_tokenizer
    from fastdeploy.input.vl_processor import VLInputProcessor

    model_dir = Path(model_dir)
    kwargs = {"max_model_len": 1024, "num_gpu_blocks_override": 80, "block_size": 16, **kwargs}
    args = EngineArgs.from_kwargs(str(model_dir), kwargs)
    config = args.create_engine_config(str(model_dir), json.loads((model_dir / "config.json").read_text()), {})
    config.cache_config = size_kv_cache(config, 0, "float32")  # the pool's size: num_gpu_blocks_override
    return VLInputProcessor(config, load_model_tokenizer(model_dir))


def hf_image_processor_pipeline(model_dir, **image_kwargs):
    """transformers' Ernie4_5_VLMoeProcessor for images on `model_dir` (its tokenizer and its PIL image
    processor read from the directory's preprocessor_config.json, `image_kwargs` over it). The stock class
    needs a video processor, which needs torchvision; this subclass leaves it out."""
    from transformers import AutoTokenizer, Ernie4_5_VLMoeImageProcessorPil, Ernie4_5_VLMoeProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageOnlyProcessor(Ernie4_5_VLMoeProcessor):
        def __init__(self, image_processor, tokenizer):
            for name in ("image", "image_start", "image_end", "video", "video_start", "video_end"):
                setattr(self, f"{name}_token", getattr(tokenizer, f"{name}_token"))
                setattr(self, f"{name}_token_id", getattr(tokenizer, f"{name}_token_id"))
            ProcessorMixin.__init__(self, image_processor, tokenizer)

    image_processor = Ernie4_5_VLMoeImageProcessorPil.from_pretrained(model_dir, **image_kwargs)
    return ImageOnlyProcessor(image_processor, AutoTokenizer.from_pretrained(model_dir))
