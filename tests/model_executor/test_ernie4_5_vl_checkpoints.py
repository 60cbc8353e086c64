"""ERNIE-4.5-VL checkpoints in both formats load into the same model.

The tiny HF checkpoint (tests/vl_helpers.py: nested config, PT names) is rewritten here into
FastDeploy's Paddle layout as FastDeploy 2.3 reads it (../shared/reference/ernie-4.5-vl.md §2, §11;
model_loader/paddle_layout.py): a flat config.json (im_patch_id, moe_num_experts [text, vision],
moe_layer_start_index, freq_allocation, spatial/temporal_conv_size, vision_config with embed_dim and
mlp_ratio, "dtype" and no "transformers_version"), `ernie.` prefixes, fused qkv_proj / up_gate_proj,
every linear weight [in, out], routers [hidden, E] unchanged, the vision tower under `vision_model.`
and the resampler under `ernie.resampler_model.`. Logits of the two loads are equal, and both
configs normalise to the same VLConfig; bad configs are refused naming the key.
"""
import json

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file, save_file

import vl_helpers
from fastdeploy.model_executor.models.ernie4_5_vl.config import VLConfig
from vl_model_access import load_our_model, prefill_logits

IMAGE, START, END = (vl_helpers.TOKEN_IDS[k] for k in ("image_token_id", "image_start_token_id", "image_end_token_id"))


def flat_config(hf: dict) -> dict:
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
        image_start_token_id=hf["image_start_token_id"], image_end_token_id=hf["image_end_token_id"],
        video_start_token_id=hf["video_start_token_id"], video_end_token_id=hf["video_end_token_id"],
        vision_config=dict(depth=vision["depth"], embed_dim=vision["hidden_size"], num_heads=vision["num_heads"],
                           mlp_ratio=vision["intermediate_size"] / vision["hidden_size"],
                           hidden_act=vision["hidden_act"], patch_size=vision["patch_size"],
                           in_channels=vision["in_channels"], spatial_merge_size=vision["spatial_merge_size"]))
    return config


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
    (paddle_dir / "config.json").write_text(json.dumps(flat_config(hf_config)))
    tensors = paddle_tensors(load_file(str(hf_dir / "model.safetensors")))
    assert any(k.startswith("vision_model.") for k in tensors) and "ernie.embed_tokens.weight" in tensors
    save_file(tensors, str(paddle_dir / "model.safetensors"))
    return hf_dir, paddle_dir


def test_paddle_layout_gives_equal_logits(checkpoints):
    hf_dir, paddle_dir = checkpoints
    hf_model, paddle_model = load_our_model(hf_dir), load_our_model(paddle_dir)
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
    flat = VLConfig.from_hf(json.loads((paddle_dir / "config.json").read_text()))
    assert flat.video_token_id == IMAGE  # FastDeploy: <|IMAGE_PLACEHOLDER|> for videos too
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
