"""ERNIE-4.5-VL checkpoints in both formats load into the same model.

The tiny HF checkpoint (tests/vl_helpers.py: nested config, PT names) is rewritten here into
FastDeploy's Paddle layout as FastDeploy 2.3 reads it (its ernie4_5_vl_moe.py and loader;
model_loader/paddle_layout.py): a flat config.json (im_patch_id, moe_num_experts [text, vision],
moe_layer_start_index, freq_allocation, spatial/temporal_conv_size, vision_config with embed_dim and
mlp_ratio, "dtype" and no "transformers_version"; no delimiter ids: FastDeploy reads them from the
tokenizer, copied beside it), `ernie.` prefixes, fused qkv_proj / up_gate_proj, every linear weight
[in, out], routers [hidden, E] unchanged, the vision tower under `vision_model.` and the resampler under
`ernie.resampler_model.`. Logits of the two loads are equal, and both configs normalise to the same
VLConfig; bad configs are refused naming the key. The special token ids come from one place
(config.py `token_ids`) in both formats: config keys, then transformers' defaults (nested) or the
tokenizer (flat), a ValueError naming key and token when neither has one; the engine's completed
config gives the model the ids the tokenizer gives the input processor.
"""
import json
import shutil

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file, save_file

import vl_helpers
from fastdeploy.input.processors import complete_hf_config
from fastdeploy.input.tokenizer_loader import load_model_tokenizer
from fastdeploy.model_executor.models.ernie4_5_vl.config import TOKEN_SOURCES, VLConfig, VLTokenIds, token_ids
from vl_model_access import load_our_model, prefill_logits

IMAGE, START, END = (vl_helpers.TOKEN_IDS[k] for k in ("image_token_id", "image_start_token_id", "image_end_token_id"))


def paddle_tensors(weights: dict) -> dict:
    """PT-layout tensors -> Paddle-layout tensors (names, fusions, [in, out])."""
    out = {}
    for name, array in weights.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name or ".up_proj." in name:
            continue  # fused with q_proj / gate_proj below
        if name.startswith("model.vision_model."):
            out[name[len("model."):]] = array.T.copy() if array.ndim == 2 else array
        elif name.startswith("model.resampler_model."):
            out["ernie." + name[len("model."):]] = array.T.copy() if array.ndim == 2 else array
        elif ".self_attn.q_proj." in name:
            parts = [weights[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            out["ernie." + name[len("model."):].replace("q_proj", "qkv_proj")] = np.concatenate(parts).T.copy()
        elif ".gate_proj." in name:
            parts = [array, weights[name.replace("gate_proj", "up_proj")]]
            out["ernie." + name[len("model."):].replace("gate_proj", "up_gate_proj")] = np.concatenate(parts).T.copy()
        elif name.endswith(("mlp.gate.weight", "mlp.gate.weight_1")) or array.ndim == 1 or "embed_tokens" in name \
                or "correction_bias" in name:
            out["ernie." + name[len("model."):]] = array
        else:
            out["ernie." + name[len("model."):]] = array.T.copy()
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    hf_dir = vl_helpers.build_tiny_vl(tmp_path_factory.mktemp("hf"))
    paddle_dir = tmp_path_factory.mktemp("paddle")
    hf_config = json.loads((hf_dir / "config.json").read_text())
    (paddle_dir / "config.json").write_text(json.dumps(vl_helpers.flat_config(hf_config)))
    tensors = paddle_tensors(load_file(str(hf_dir / "model.safetensors")))
    assert any(k.startswith("vision_model.") for k in tensors) and "ernie.embed_tokens.weight" in tensors
    save_file(tensors, str(paddle_dir / "model.safetensors"))
    for path in hf_dir.iterdir():  # the tokenizer and its template
        if path.name not in ("config.json", "model.safetensors", "generation_config.json"):
            shutil.copy(path, paddle_dir / path.name)
    return hf_dir, paddle_dir


@pytest.mark.parametrize("packed", [False, True])
def test_paddle_layout_gives_equal_logits(checkpoints, packed, ops_enabled):
    """Also with every linear packed in bf16 (the Paddle layout's [in, out] encoder weights packed alike)."""
    from fastdeploy.model_executor.layers.quantization.packed import BF16, PackedConfig, PackedLinearMethod

    hf_dir, paddle_dir = checkpoints
    quant = PackedConfig(BF16) if packed else None
    hf_model, paddle_model = load_our_model(hf_dir, quant_config=quant), load_our_model(paddle_dir, quant_config=quant)
    qkv = paddle_model.model.vision_model.blocks[0].attn.qkv
    assert isinstance(qkv.method, PackedLinearMethod) == packed
    grids = [(1, 4, 6)]
    pixels = np.random.default_rng(0).standard_normal((24, 588)).astype(np.float32)
    ids = np.array([1, 20, 30, START] + [IMAGE] * 6 + [END, 40, 50])
    t = np.r_[np.arange(4), np.full(6, 4), [6, 7, 8, 9]]
    positions = np.stack([t, np.r_[np.arange(4), [4, 4, 4, 5, 5, 5], [6, 7, 8, 9]],
                          np.r_[np.arange(4), [4, 5, 6, 4, 5, 6], [6, 7, 8, 9]]])
    logits = []
    for model in (hf_model, paddle_model):
        embeds = model.embed_input_ids(paddle.to_tensor(ids)).numpy().copy()
        with paddle.no_grad():
            embeds[ids == IMAGE] = model.encode_vision(paddle.to_tensor(pixels), grids).numpy()
        logits.append(prefill_logits(model, ids, positions, paddle.to_tensor(embeds)))
    assert np.abs(logits[0]).max() > 0.1
    assert np.abs(logits[0] - logits[1]).max() <= 1e-5


def test_both_configs_normalise_alike(checkpoints):
    hf_dir, paddle_dir = checkpoints
    nested = VLConfig.from_hf(json.loads((hf_dir / "config.json").read_text()))
    flat = VLConfig.from_hf(json.loads((paddle_dir / "config.json").read_text()), load_model_tokenizer(paddle_dir))
    ids = vl_helpers.TOKEN_IDS
    assert nested.token_ids == VLTokenIds(*(ids[TOKEN_SOURCES[f][0]] for f in TOKEN_SOURCES))
    # FastDeploy: <|IMAGE_PLACEHOLDER|> for videos too; the delimiters from the tokenizer
    assert flat.token_ids == VLTokenIds(IMAGE, START, END, IMAGE, ids["video_start_token_id"], ids["video_end_token_id"])
    assert nested.mrope_section == flat.mrope_section == (3, 3, 2)
    assert nested.sparse_layers == flat.sparse_layers == (False, True)
    assert nested.vision == flat.vision
    assert (nested.num_experts, nested.moe_intermediate_size) == (flat.num_experts, flat.moe_intermediate_size)


@pytest.mark.parametrize("change, key", [
    (lambda c: c["text_config"]["rope_parameters"].update(mrope_section=[4, 2, 2]), "mrope_section"),
    (lambda c: c["text_config"].update(mlp_layer_types=["dense"]), "mlp_layer_types"),
    (lambda c: c["vision_config"].update(temporal_merge_size=3), "temporal_merge_size"),
    (lambda c: c.pop("vision_config"), "vision_config"),
])
def test_bad_config_is_refused_naming_the_key(checkpoints, change, key):
    config = json.loads((checkpoints[0] / "config.json").read_text())
    change(config)
    with pytest.raises(ValueError, match=key):
        VLConfig.from_hf(config)


def test_different_text_and_vision_moe_ranges_are_refused(checkpoints):
    config = json.loads((checkpoints[1] / "config.json").read_text())
    config["moe_layer_start_index"] = [1, 0]
    with pytest.raises(ValueError, match="moe_layer_start_index"):
        VLConfig.from_hf(config)


class FakeTokenizer:
    """A vocabulary of `tokens` (id 100 + position); everything else is <unk> (id 0)."""

    unk_token_id = 0

    def __init__(self, tokens):
        self.tokens = list(tokens)

    def convert_tokens_to_ids(self, token):
        return 100 + self.tokens.index(token) if token in self.tokens else self.unk_token_id


def test_nested_ids_come_from_the_config_else_transformers_defaults(checkpoints):
    config = json.loads((checkpoints[0] / "config.json").read_text())
    del config["image_start_token_id"], config["video_token_id"]
    ids = token_ids(config, FakeTokenizer(["<|IMAGE_START|>"]))  # transformers' model ignores the tokenizer
    assert (ids.image, ids.image_start, ids.video) == (IMAGE, 101304, 103367)


def test_flat_ids_come_from_the_config_else_the_tokenizer(checkpoints):
    config = json.loads((checkpoints[1] / "config.json").read_text())
    tokenizer = FakeTokenizer(["<|IMAGE_PLACEHOLDER|>", "<|IMAGE_START|>", "<|IMAGE_END|>", "<|VIDEO_START|>",
                               "<|VIDEO_END|>"])
    assert token_ids(config, tokenizer) == VLTokenIds(IMAGE, 101, 102, IMAGE, 103, 104)
    del config["im_patch_id"]
    assert token_ids(config, tokenizer) == VLTokenIds(100, 101, 102, 100, 103, 104)
    config["image_end_token_id"] = 7
    assert token_ids(config, tokenizer).image_end == 7


@pytest.mark.parametrize("tokens, message", [
    (["<|IMAGE_START|>", "<|VIDEO_START|>", "<|VIDEO_END|>"], r"no image_end_token_id and the tokenizer has no <\|IMAGE_END\|>"),
    (None, r"no image_start_token_id and no tokenizer was given to look up <\|IMAGE_START\|>"),
])
def test_flat_id_in_neither_config_nor_tokenizer_is_refused(checkpoints, tokens, message):
    config = json.loads((checkpoints[1] / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        VLConfig.from_hf(config, None if tokens is None else FakeTokenizer(tokens))


@pytest.mark.parametrize("which", [0, 1])
def test_engine_config_gives_the_model_the_processor_ids(checkpoints, which):
    directory = checkpoints[which]
    tokenizer = load_model_tokenizer(directory)
    raw = json.loads((directory / "config.json").read_text())
    completed = complete_hf_config(raw, tokenizer)
    processor_ids = token_ids(completed, tokenizer)  # what VLInputProcessor reads
    assert VLConfig.from_hf(completed).token_ids == processor_ids == token_ids(raw, tokenizer)
    model = load_our_model(directory)  # builds from the completed config, as the engine does
    assert model._vision_ids.tolist() == list(processor_ids.vision)
    assert set(processor_ids.vision) == {tokenizer.convert_tokens_to_ids(t) for _, t, _ in TOKEN_SOURCES.values()} - (
        {tokenizer.convert_tokens_to_ids("<|VIDEO_PLACEHOLDER|>")} if which == 1 else set())
