"""FastDeploy's Paddle-layout checkpoints (the `-Paddle` repos) load like their Hugging Face twins.

Each tiny random model is written by transformers 5 (HF layout), then rewritten IN THIS FILE into
the Paddle layout by an independent converter following FastDeploy 2.x (see `to_paddle_layout`):
config.json with "dtype" and no "torch_dtype"/"transformers_version", [in, out] linear weights,
lm_head [hidden, vocab], the router [hidden, experts]; ERNIE-4.5 with the `ernie.` prefix, fused
`qkv_proj` ([q | k | v] columns) and `up_gate_proj` ([gate | up]), its dense architecture named
`Ernie4_5_ForCausalLM`, and (MoE) the MTP draft-head tensors of the MoE repos; Qwen2 with the
`qwen2.` prefix; Qwen3 / Qwen3-MoE with `model.`, all unfused.

Checks: the Paddle-layout load's logits equal transformers' within 1e-4 over a ragged batch; its
greedy tokens equal the HF-layout load's; `is_paddle_layout` tells both configs apart (a
transformers-5 config carries "dtype" yet is HF layout); an unknown tensor name is a ValueError
naming it.
"""
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.model_loader.hf_loader import open_hf_dir
from fastdeploy.model_executor.model_loader.paddle_layout import is_paddle_layout
from test_llama_vs_transformers import our_prefill_logits
from tiny_llama import VOCAB_SIZE, write_tokenizer

PROMPT_LENGTHS = [1, 9, 70, 131]  # ragged, across block boundaries of block_size 64
GREEDY_TOKENS = 16

COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2,
              bos_token_id=1, eos_token_id=2, pad_token_id=2)

# name -> (transformers config class, model class, config kwargs, Paddle base prefix, fused qkv/up_gate)
MODELS = {
    "ernie45": ("Ernie4_5Config", "Ernie4_5ForCausalLM",
                dict(num_hidden_layers=2, head_dim=16, use_bias=True, tie_word_embeddings=False), "ernie.", True),
    "ernie45_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
                    dict(num_hidden_layers=3, moe_num_experts=6, moe_k=2, moe_layer_start_index=1,
                         moe_num_shared_experts=1, moe_intermediate_size=32, tie_word_embeddings=True),
                    "ernie.", True),
    # use_bias: every linear layer (fused qkv / up_gate biases) and lm_head have biases
    "ernie45_moe_bias": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
                         dict(num_hidden_layers=2, moe_num_experts=4, moe_k=2, moe_layer_start_index=1,
                              moe_num_shared_experts=1, moe_intermediate_size=32, use_bias=True,
                              tie_word_embeddings=False), "ernie.", True),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_hidden_layers=2, tie_word_embeddings=False), "qwen2.", False),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(num_hidden_layers=2, head_dim=32, tie_word_embeddings=True), "model.", False),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_hidden_layers=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, norm_topk_prob=True, tie_word_embeddings=False),
                  "model.", False),
}


def make_hf_checkpoint(path: Path, name: str, seed: int = 0):
    """Random tiny `name` saved by transformers at `path` (HF layout); returns the model (float32)."""
    import transformers

    config_cls, model_cls, kwargs, _, _ = MODELS[name]
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**COMMON, **kwargs)).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # transformers initializes these to 0 / 1: randomize so they are exercised
        for pname, param in model.named_parameters():
            if pname.endswith((".bias", "e_score_correction_bias")):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
            elif "norm" in pname:
                param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=gen))
    path.mkdir(parents=True)
    model.save_pretrained(str(path))
    write_tokenizer(path)
    return model


def _fuse(tensors: dict, pattern: str, parts: list[str], fused: str) -> None:
    """Concatenate along the output (last) axis the [in, out] tensors named by `parts` into `fused`."""
    for key in [k for k in tensors if re.search(pattern, k)]:
        stem, suffix = re.match(pattern, key).groups()
        names = [f"{stem}.{p}.{suffix}" for p in parts]
        tensors[f"{stem}.{fused}.{suffix}"] = np.concatenate([tensors.pop(n) for n in names], axis=-1)


def to_paddle_layout(hf_dir: Path, out: Path, name: str) -> Path:
    """Rewrite the HF-layout checkpoint `hf_dir` as FastDeploy's Paddle layout at `out`."""
    _, _, _, prefix, fused = MODELS[name]
    config = json.loads((hf_dir / "config.json").read_text())
    tensors = {}
    for key, array in load_file(str(hf_dir / "model.safetensors")).items():
        linear = array.ndim == 2 and key.endswith(".weight") and "embed_tokens" not in key
        array = array.T if linear else array  # [out, in] -> [in, out]
        key = key if key.startswith("lm_head.") else prefix + key[len("model."):]
        tensors[key] = array
    if fused:  # ERNIE's -Paddle repos: qkv_proj = [q | k | v], up_gate_proj = [gate | up]
        _fuse(tensors, r"^(.*\.self_attn)\.q_proj\.(weight|bias)$", ["q_proj", "k_proj", "v_proj"], "qkv_proj")
        _fuse(tensors, r"^(.*\.mlp(?:\.shared_experts|\.experts\.\d+)?)\.gate_proj\.(weight|bias)$",
              ["gate_proj", "up_proj"], "up_gate_proj")
    if name == "ernie45":
        config["architectures"] = ["Ernie4_5_ForCausalLM"]
    if name.startswith("ernie45_moe"):  # the MoE repos carry the MTP draft head; and their MoE config keys
        h = config["hidden_size"]
        tensors.update({"ernie.mtp_emb_norm.0.weight": np.ones(h, np.float32),
                        "ernie.mtp_hidden_norm.0.weight": np.ones(h, np.float32),
                        "ernie.mtp_linear_proj.0.weight": np.zeros((2 * h, h), np.float32),
                        "ernie.mtp_block.0.self_attn.o_proj.weight": np.zeros((h, h), np.float32)})
        config.update(moe_use_aux_free=True, moe_gate="topk", use_rmsnorm=True, num_nextn_predict_layers=1)
        for key in ("moe_norm_min", "moe_layer_end_index"):  # defaults, absent from -Paddle configs
            config.pop(key)
    config.pop("transformers_version")
    config.pop("torch_dtype", None)
    config["dtype"] = "bfloat16"  # the -Paddle repos' marker (our tensors stay float32 for the 1e-4 check)
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
    out.mkdir(parents=True)
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "np"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in hf_dir.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, out / f.name)
    return out


def test_layout_rule(tmp_path):
    paddle_cfg = {"architectures": ["Ernie4_5_MoeForCausalLM"], "dtype": "bfloat16", "hidden_size": 2560,
                  "model_type": "ernie4_5_moe", "moe_num_experts": 64, "moe_use_aux_free": True}
    assert is_paddle_layout(paddle_cfg)  # FastDeploy: "dtype" -> paddle
    pt_cfg = {"architectures": ["Ernie4_5ForCausalLM"], "torch_dtype": "bfloat16"}
    assert not is_paddle_layout(pt_cfg)  # FastDeploy: "torch_dtype" -> torch
    assert not is_paddle_layout({**pt_cfg, "transformers_version": "4.54.0"})
    assert not is_paddle_layout({"architectures": ["LlamaForCausalLM"]})  # neither key: HF, as before
    assert not is_paddle_layout({**pt_cfg, "dtype": "bfloat16"})  # both (FastDeploy raises): HF
    make_hf_checkpoint(tmp_path / "hf", "qwen2")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "dtype" in written and "torch_dtype" not in written  # transformers 5 writes "dtype" ...
    assert not is_paddle_layout(written)  # ... and is still the HF layout (FastDeploy's rule says paddle)
    assert is_paddle_layout(json.loads((to_paddle_layout(tmp_path / "hf", tmp_path / "pd", "qwen2")
                                        / "config.json").read_text()))


@pytest.mark.parametrize("name", list(MODELS))
def test_paddle_layout_matches_transformers_and_hf_layout(tmp_path, name):
    hf = make_hf_checkpoint(tmp_path / "hf", name)
    paddle_dir = to_paddle_layout(tmp_path / "hf", tmp_path / "paddle", name)
    names = load_file(str(paddle_dir / "model.safetensors"))
    assert not any(k.startswith("model.") for k in names) or MODELS[name][3] == "model."
    assert any(k.endswith("qkv_proj.weight") for k in names) == MODELS[name][4]
    assert not is_paddle_layout(json.loads((tmp_path / "hf" / "config.json").read_text()))
    assert is_paddle_layout(json.loads((paddle_dir / "config.json").read_text()))

    # dtype="float32": the config says bfloat16, which "auto" would hold in bf16 on a CPU with AVX512-BF16
    paddle_llm = LLM(model=str(paddle_dir), max_model_len=512, num_gpu_blocks_override=16, dtype="float32")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, VOCAB_SIZE, size=n).tolist() for n in PROMPT_LENGTHS]
    for prompt, logits in zip(prompts, our_prefill_logits(paddle_llm, prompts)):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0].numpy()
        assert np.abs(logits - ref).max() <= 1e-4, name

    params = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    from_paddle = [o.outputs.token_ids for o in paddle_llm.generate(prompts, params, use_tqdm=False)]
    del paddle_llm
    hf_llm = LLM(model=str(tmp_path / "hf"), max_model_len=512, num_gpu_blocks_override=16)
    from_hf = [o.outputs.token_ids for o in hf_llm.generate(prompts, params, use_tqdm=False)]
    assert from_paddle == from_hf
    assert all(len(t) == GREEDY_TOKENS for t in from_paddle)
    assert len({t for toks in from_paddle for t in toks}) > 4  # continuations vary


def test_unmappable_tensor_name_is_an_error(tmp_path):
    make_hf_checkpoint(tmp_path / "hf", "ernie45")
    paddle_dir = to_paddle_layout(tmp_path / "hf", tmp_path / "paddle", "ernie45")
    file = paddle_dir / "model.safetensors"
    tensors = load_file(str(file))
    tensors["ernie.layers.1.self_attn.rotary_gate.weight"] = np.zeros((64, 64), np.float32)
    save_file(tensors, str(file), metadata={"format": "np"})
    with pytest.raises(ValueError, match=r"'ernie\.layers\.1\.self_attn\.rotary_gate\.weight'"):
        for _ in open_hf_dir(paddle_dir).weights():
            pass
    with pytest.raises(ValueError, match=r"'ernie\.layers\.1\.self_attn\.rotary_gate\.weight'"):
        LLM(model=str(paddle_dir), max_model_len=512, num_gpu_blocks_override=16)
