"""Tiny random checkpoints of the model zoo (Qwen2, Qwen3, ERNIE-4.5 dense) written by transformers.

Each is 2 layers, GQA 4:2, vocab VOCAB_SIZE, saved with `save_pretrained` (config.json with the
right `architectures` and rope settings in `rope_parameters`, as transformers 5 writes them), plus
tiny_llama's byte-level tokenizer. initializer_range 0.2 so greedy continuations vary; the biases
and norm weights, which transformers initializes to 0 and 1, are randomized too, so that the q/k/v
(Qwen2) or all-linear (ERNIE use_bias) biases, the per-head q/k norms (Qwen3) and the ERNIE q/k bias
permutation are all exercised by a comparison of logits.
"""
import json
import shutil
from pathlib import Path
from typing import Callable

from tiny_llama import VOCAB_SIZE, write_tokenizer

COMMON = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)

# name -> (architecture in config.json, config overrides); see make_tiny_model
TINY_MODELS = {
    "qwen2": ("Qwen2ForCausalLM", dict(rms_norm_eps=1e-6, tie_word_embeddings=False,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # head_dim 32 != hidden 64 / 4 heads: q_proj is [128, 64], o_proj [64, 128]
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "ernie45": ("Ernie4_5ForCausalLM", dict(head_dim=16, use_bias=False, rms_norm_eps=1e-5,
                                            tie_word_embeddings=True,
                                            rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "ernie45_bias": ("Ernie4_5ForCausalLM", dict(head_dim=16, use_bias=True, rms_norm_eps=1e-5,
                                                 tie_word_embeddings=False,
                                                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
}


def _classes(architecture: str):
    import transformers

    config_cls = {"Qwen2ForCausalLM": "Qwen2Config", "Qwen3ForCausalLM": "Qwen3Config",
                  "Ernie4_5ForCausalLM": "Ernie4_5Config"}[architecture]
    return getattr(transformers, config_cls), getattr(transformers, architecture)


def randomize_biases_and_norms(model, seed: int) -> None:
    """Biases ~ N(0, 0.2) and norm weights (any name with "norm" in any case) ~ 1 + N(0, 0.2) (transformers
    initializes them to 0 and 1)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.copy_(0.2 * torch.randn(param.shape, generator=gen))
            elif "norm" in name.lower():  # also BERT's LayerNorm
                param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=gen))


def make_tiny_model(path: Path, name: str, seed: int = 0):
    """Save the random tiny model `name` (a key of TINY_MODELS) at `path`; returns it (float32, eval)."""
    import torch

    architecture, overrides = TINY_MODELS[name]
    config_cls, model_cls = _classes(architecture)
    torch.manual_seed(seed)
    config = config_cls(**COMMON, **overrides)
    model = model_cls(config).eval()
    randomize_biases_and_norms(model, seed)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    write_tokenizer(path)
    cfg = read_config(path)
    assert cfg["architectures"] == [architecture], cfg.get("architectures")
    assert cfg["rope_parameters"]["rope_theta"] == overrides["rope_parameters"]["rope_theta"], cfg
    return model


# ---- checkpoint surgery for the loading-error tests --------------------------------------------
def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def copy_checkpoint(src: Path, dst: Path, edit_config: Callable[[dict], None] = None) -> Path:
    """A copy of the checkpoint directory, with config.json edited in place by `edit_config`."""
    shutil.copytree(src, dst)
    if edit_config is not None:
        cfg = read_config(dst)
        edit_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def edit_safetensors(path: Path, edit: Callable[[dict], None]) -> None:
    """Rewrite the single model.safetensors at `path` after `edit` changes the {name: array} dict."""
    from safetensors.numpy import load_file, save_file

    file = path / "model.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), metadata={"format": "pt"})
