"""ERNIE-4.5-VL with `dtype="bfloat16"` (and wint8/wint4) on the tiny checkpoint: every linear of the vision
tower, the resampler and the text decoder packed (layers/quantization/packed.py), activations float32.

Oracles, transformers on the same weights:
- the vision tower + resampler against transformers in float32 with each nn.Linear's input and weight
  rounded to bf16 (what `fd_packed_linear` multiplies: bf16 x bf16 summed in float32; everything else
  float32 on both sides, our attention switched to the float32 op for this check): within 1e-4 of the
  output's largest value (summation order). The bf16 attention (`vision_attention_bf16`, what runs) is
  checked against float64 in tests/model_executor/test_vision_attention_bf16.py; emulating it in
  transformers does not give a tight oracle: q and k after RoPE differ from ours by an ulp of float32,
  enough to round some elements to the neighbouring bf16 value (measured 2026-11-26: 0.5% of the largest
  output after two blocks and the resampler);
- the same output against transformers run in bfloat16 (`dtype=torch.bfloat16`: every op in bf16): each
  side is a bf16 rounding away from float32 (measured 2026-11-26: ours 0.8%, transformers' 0.9% of the
  largest value, the two apart by 0.9%); the bar 3% is the bf16 unit roundoff 2^-8 = 0.4% over the ~8
  roundings in a row on the deepest path (patch embed, 2 blocks x (qkv, proj, fc1, fc2), resampler);
- LLM.chat greedy tokens with one image against transformers bf16 `generate`, 8 prompts x 10 tokens. On
  this random model (hidden 64, weights of std 0.2) free-running greedy paths part at near ties, and
  transformers bf16's logits lie up to ~6% of the largest |logit| from float32's (measured 2026-11-26;
  whole paths: transformers bf16 = float32 on 5 of 8 prompts, ours bf16 = transformers bf16 on 3), so
  one early tie decides a whole path. The bar is per token, teacher-forced along transformers bf16's
  path (our model's logits over prompt + its tokens, in one prefill): our argmax must be its token on
  >= 70 of 80, the text models' bf16 bar (28 of 32) as a fraction; transformers float32 scores 76 here. The
  engine's own first token must be the teacher-forced one (the chat path is the model tested).
  float32 stays exact: tests/vl/test_vl_end_to_end.py.
Also: the packed weights are what is held (no float32 copy); wint8/wint4 reach the encoder's linears
where the kind takes their in_features (wint4: the 588-input patch embed stays float32); the KV pool is
sized from the bytes held, encoder included; dtype="auto" on a bf16 VL checkpoint packs every linear.
"""
import os
import sys

import numpy as np
import paddle
import pytest
import torch

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.layers.linear import Linear
from fastdeploy.model_executor.layers.quantization.packed import BF16, PackedLinearMethod, packed_bytes
from test_vl_end_to_end import IMAGE, VISION_IDS, hf_greedy
from vl_fakes import random_image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "model_executor"))  # runner_access's place
from runner_access import model_runner  # noqa: E402

KWARGS = dict(max_model_len=512, block_size=16, num_gpu_blocks_override=64, max_num_seqs=4)
GRIDS = [(1, 4, 4), (1, 4, 8), (1, 6, 2), (4, 2, 4)]  # square, wide, tall images and a 4-frame video
TEXTS = ["Describe the picture in detail.", "What is in the picture?", "Which animal, how many frames?",
         "what colour is the chair?", "The quick brown fox", "Describe the image and the video.",
         "A cat sits on a red chair", "how many?"]
NEW_TOKENS = 10


@pytest.fixture(scope="module", autouse=True)
def ops_enabled():
    """The packed formats need the compiled ops, also under FD_DISABLE_CUSTOM_OPS=1."""
    from fastdeploy.model_executor.ops import fallbacks_forced

    with fallbacks_forced(False):
        yield


@pytest.fixture(scope="module")
def bf16_llm(vl_dir):
    llm = LLM(model=str(vl_dir), dtype="bfloat16", **KWARGS)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def hf_bf16(vl_dir):
    from transformers import Ernie4_5_VLMoeForConditionalGeneration

    return Ernie4_5_VLMoeForConditionalGeneration.from_pretrained(vl_dir, dtype=torch.bfloat16).eval()


def encoder_linears(model) -> dict:
    return {name: layer for name, layer in model.model.named_sublayers()
            if isinstance(layer, Linear) and name.startswith(("vision_model", "resampler_model"))}


def pixels_of(grids, seed=0):
    return np.random.default_rng(seed).standard_normal((sum(t * h * w for t, h, w in grids), 588)).astype(np.float32)


def hf_encode(hf, pixels, grids, dtype=torch.float32) -> np.ndarray:
    with torch.no_grad():
        vision = hf.model.vision_tower(torch.tensor(pixels).to(dtype), torch.tensor(grids)).last_hidden_state
        return hf.model.resampler_model(vision, torch.tensor(grids)).float().numpy()


def ours_encode(llm, pixels, grids) -> np.ndarray:
    with paddle.no_grad():
        return model_runner(llm).model.encode_vision(paddle.to_tensor(pixels), grids).numpy()


def test_every_linear_is_packed_in_bf16(bf16_llm):
    model = model_runner(bf16_llm).model
    linears = [layer for layer in model.sublayers() if isinstance(layer, Linear)]
    assert len(encoder_linears(model)) == 1 + 2 * 4 + 5  # patch embed, 2 blocks x 4, resampler 5
    assert all(isinstance(layer.method, PackedLinearMethod) and layer.method.packed for layer in linears)
    assert all(layer.weight.dtype == paddle.uint8 for layer in linears)  # no float32 copy held


def vision_attentions(llm) -> list:
    from fastdeploy.model_executor.models.ernie4_5_vl.vision import VisionAttention

    return [layer for layer in model_runner(llm).model.sublayers() if isinstance(layer, VisionAttention)]


def test_attention_is_bf16_when_the_linears_are_packed_and_the_cpu_has_amx(bf16_llm, vl_dir, monkeypatch):
    from fastdeploy.model_executor.layers.quantization.weight_format import cpu_has_amx_bf16
    from fastdeploy.model_executor.models.ernie4_5_vl import vision
    from fastdeploy.model_executor.ops.vision_attention import vision_attention, vision_attention_bf16

    expected = vision_attention_bf16 if cpu_has_amx_bf16() else vision_attention
    assert [layer.attention for layer in vision_attentions(bf16_llm)] == [expected] * 2
    monkeypatch.setattr(vision, "cpu_has_amx_bf16", lambda: False)  # AMD Zen 4: the float32 op is faster
    llm = LLM(model=str(vl_dir), dtype="bfloat16", **KWARGS)
    assert [layer.attention for layer in vision_attentions(llm)] == [vision_attention] * 2
    llm.shutdown()
    monkeypatch.setattr(vision, "cpu_has_amx_bf16", lambda: True)
    llm = LLM(model=str(vl_dir), dtype="bfloat16", **KWARGS)
    assert [layer.attention for layer in vision_attentions(llm)] == [vision_attention_bf16] * 2
    llm.shutdown()
    llm = LLM(model=str(vl_dir), dtype="float32", **KWARGS)
    assert [layer.attention for layer in vision_attentions(llm)] == [vision_attention] * 2
    llm.shutdown()


def test_encoder_equals_transformers_with_bf16_matmul_inputs(bf16_llm, vl_dir, monkeypatch):
    from fastdeploy.model_executor.ops.vision_attention import vision_attention
    from vl_helpers import load_hf_model

    for layer in vision_attentions(bf16_llm):
        monkeypatch.setattr(layer, "attention", vision_attention)
    hf = load_hf_model(vl_dir)
    encoder = [hf.model.vision_tower, hf.model.resampler_model]
    with torch.no_grad():
        for module in encoder:
            for layer in module.modules():
                if isinstance(layer, torch.nn.Linear):
                    layer.weight.copy_(layer.weight.bfloat16().float())
                    layer.register_forward_pre_hook(lambda _, args: (args[0].bfloat16().float(),))
    pixels = pixels_of(GRIDS)
    ref, plain = hf_encode(hf, pixels, GRIDS), hf_encode(load_hf_model(vl_dir), pixels, GRIDS)
    ours = ours_encode(bf16_llm, pixels, GRIDS)
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() <= 1e-4 * scale
    assert np.abs(ours - plain).max() > 1e-3 * scale  # bf16 moved it: the packed path ran


def test_encoder_is_within_bf16_error_of_transformers_bf16(bf16_llm, hf_bf16):
    pixels = pixels_of(GRIDS, seed=1)
    ref = hf_encode(hf_bf16, pixels, GRIDS, torch.bfloat16)
    assert np.abs(ours_encode(bf16_llm, pixels, GRIDS) - ref).max() <= 0.03 * np.abs(ref).max()


def path_logits(hf, ids, pixels, grids) -> np.ndarray:
    """transformers' logits [len, vocab] float32 over the token sequence ids [1, len] with one image."""
    hf.model.rope_deltas = None
    with torch.no_grad():
        logits = hf(input_ids=ids, pixel_values=pixels.to(hf.dtype), image_grid_thw=grids,
                    mm_token_type_ids=(ids == IMAGE).int(),
                    moe_mm_token_type_ids=torch.isin(ids, torch.tensor(VISION_IDS)).int()).logits[0].float().numpy()
    hf.model.rope_deltas = None
    logits[:, VISION_IDS] = -np.inf  # banned on both sides
    return logits


def our_path_logits(llm, ids, pixels, grids, hf32) -> np.ndarray:
    """Our logits [len, vocab] over ids [1, len] with one image in one prefill (teacher forcing), positions
    from transformers' get_rope_index (equal to ours: tests/model_executor/test_ernie4_5_vl_vs_transformers.py)."""
    from vl_model_access import prefill_logits

    model = model_runner(llm).model
    hf32.model.rope_deltas = None
    with torch.no_grad():
        positions, _ = hf32.model.get_rope_index(ids, (ids == IMAGE).int(), image_grid_thw=grids)
    hf32.model.rope_deltas = None
    flat = ids[0].numpy()
    embeds = model.embed_input_ids(paddle.to_tensor(flat)).numpy().copy()
    embeds[flat == IMAGE] = ours_encode(llm, pixels.numpy(), [tuple(g) for g in grids.tolist()])
    logits = prefill_logits(model, flat, positions[:, 0].numpy(), paddle.to_tensor(embeds),
                            cache_dtype=llm.llm_engine.config.cache_config.dtype)  # the engine's: bf16
    logits[:, VISION_IDS] = -np.inf
    return logits


def test_chat_greedy_agrees_with_transformers_bf16(bf16_llm, hf_bf16, vl_hf_model, tmp_path):
    from transformers import Ernie4_5_VLMoeImageProcessorPil

    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, bad_words_token_ids=VISION_IDS)
    ours_agree = exact_agree = same = 0
    for k, text in enumerate(TEXTS):
        image = random_image(56 + 28 * (k % 3), 84 - 14 * (k % 2), seed=10 + k)
        image.save(tmp_path / f"{k}.png")
        url = {"url": str(tmp_path / f"{k}.png")}
        conversation = [{"role": "user", "content": [{"type": "image_url", "image_url": url},
                                                     {"type": "text", "text": text}]}]
        out = bf16_llm.chat(conversation, params, use_tqdm=False)[0]
        ids, expected = hf_greedy(hf_bf16, out.prompt, [image], bf16_llm.get_tokenizer())
        assert out.prompt_token_ids == ids
        pixels = Ernie4_5_VLMoeImageProcessorPil()(images=[image], return_tensors="pt")
        full = torch.tensor([ids + expected])
        rows = slice(len(ids) - 1, len(ids) - 1 + NEW_TOKENS)
        ours = our_path_logits(bf16_llm, full, pixels["pixel_values"], pixels["image_grid_thw"], vl_hf_model)[rows]
        exact = path_logits(vl_hf_model, full, pixels["pixel_values"], pixels["image_grid_thw"])[rows]
        first = ours[0].argmax()
        assert out.outputs.token_ids[0] == first  # the engine's first token is the teacher-forced one
        ours_agree += int((ours.argmax(axis=1) == expected).sum())
        exact_agree += int((exact.argmax(axis=1) == expected).sum())
        same += out.outputs.token_ids == expected
    # 2026-11-26: ours 73 of 80, transformers float32 76, whole 10-token paths equal on 3 of 8 prompts
    assert ours_agree >= 70, (ours_agree, exact_agree, same)


def held_bytes(layers) -> int:
    return sum(p.numel().item() * p.element_size() for layer in layers for p in layer.parameters())


def test_weights_held_in_bf16_take_about_half(vl_dir, bf16_llm):
    """Each packed weight is the op's layout and nothing else (2 bytes a weight, output features padded to
    panels of 64: the tiny tower's 32-wide outputs double; the resampler's widths are multiples of 64, as
    every width of the real 28B-A3B encoder is)."""
    llm = LLM(model=str(vl_dir), dtype="float32", **KWARGS)
    full, half = model_runner(llm).model, model_runner(bf16_llm).model
    for layer in encoder_linears(half).values():
        assert layer.weight.numel().item() == packed_bytes(BF16, layer.out_features, layer.in_features)
    resampler = held_bytes([half.model.resampler_model]) / held_bytes([full.model.resampler_model])
    assert 0.5 <= resampler < 0.52, resampler  # biases and norms stay float32
    assert held_bytes([half]) < 0.6 * held_bytes([full]), held_bytes([half]) / held_bytes([full])
    llm.shutdown()


@pytest.mark.parametrize("quantization", ["wint8", "wint4"])
def test_weight_only_reaches_the_encoder_where_the_shape_fits(vl_dir, quantization):
    from vl_helpers import load_hf_model

    llm = LLM(model=str(vl_dir), quantization=quantization, **KWARGS)
    linears = encoder_linears(model_runner(llm).model)
    dense = sorted(name for name, layer in linears.items() if not layer.method.packed)
    assert dense == ([] if quantization == "wint8" else ["vision_model.patch_embed.proj"])  # 588 % 32 != 0
    pixels = pixels_of(GRIDS, seed=2)
    ref = hf_encode(load_hf_model(vl_dir), pixels, GRIDS)
    error = np.abs(ours_encode(llm, pixels, GRIDS) - ref).max() / np.abs(ref).max()
    assert 1e-4 < error < (0.03 if quantization == "wint8" else 0.3), error
    llm.shutdown()


def test_encoder_bytes_count_the_vision_tower_and_resampler_as_held(vl_dir):
    """float32: the count equals the parameters' bytes exactly (the tiny encoder's widths are under one
    64-wide panel, so packed formats pad it and are checked on the whole model below)."""
    llm = LLM(model=str(vl_dir), dtype="float32", **KWARGS)
    model = model_runner(llm).model
    config = llm.llm_engine.config.model_config
    assert config.encoder_bytes(4.0) == held_bytes([model.model.vision_model, model.model.resampler_model]) > 0
    llm.shutdown()


@pytest.mark.parametrize("settings", [dict(dtype="float32"), dict(dtype="bfloat16"), dict(quantization="wint8"),
                                      dict(quantization="wint4")])
def test_kv_pool_is_sized_from_the_weights_as_held_encoder_included(vl_dir, settings, monkeypatch):
    from fastdeploy.cache_manager import kv_cache_sizing

    seen = []
    original = kv_cache_sizing.size_kv_cache
    monkeypatch.setattr(kv_cache_sizing, "size_kv_cache",
                        lambda config, weights_bytes, dtype: seen.append(weights_bytes)
                        or original(config, weights_bytes, dtype))
    llm = LLM(model=str(vl_dir), max_model_len=512, **settings)
    model = model_runner(llm).model
    held = held_bytes([model])
    encoder = held_bytes([model.model.vision_model, model.model.resampler_model])
    assert encoder > 0.25 * held  # the tiny model's encoder is a large share: leaving it out would show
    # float32: the decoder's dense first layer is counted as MoE (conservative), 6% over here. Packed formats
    # pad each linear's outputs to a 64-wide panel, which doubles this model's 16- and 32-wide expert and
    # tower outputs (the count assumes none, right for real widths): 6% (bf16) to 10% (wint8) under here.
    assert abs(seen[0] / held - 1) < (0.1 if settings == dict(dtype="float32") else 0.15), (seen[0], held)
    llm.shutdown()


def test_auto_on_a_bf16_checkpoint_packs_every_linear(vl_dir, tmp_path):
    """The tiny checkpoint saved in bf16 (tensors and config.json's dtype, as real ERNIE-4.5-VL checkpoints):
    dtype="auto" holds it in bf16 where the CPU multiplies bf16 natively, else float32."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from fastdeploy.model_executor.layers.quantization.weight_format import cpu_has_bf16

    for item in vl_dir.iterdir():
        if item.suffix != ".safetensors":
            shutil.copy(item, tmp_path / item.name)
    for file in vl_dir.glob("*.safetensors"):
        tensors = {k: v.bfloat16() for k, v in load_file(file).items()}
        save_file(tensors, tmp_path / file.name, metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    llm = LLM(model=str(tmp_path), **KWARGS)
    linears = [layer for layer in model_runner(llm).model.sublayers() if isinstance(layer, Linear)]
    packed = [isinstance(layer.method, PackedLinearMethod) for layer in linears]
    assert all(packed) if cpu_has_bf16() else not any(packed)
    llm.shutdown()
