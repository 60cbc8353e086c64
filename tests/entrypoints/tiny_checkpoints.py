"""Tiny random Llama checkpoints for the API tests that must build many LLMs quickly (the seed docs'
settings, warm-up, model sources): tests/model_executor/tiny_llama.py's model, with the context
the seed docs' `max_model_len` values need, in float32 or float16."""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "model_executor"))

from tiny_llama import make_tiny_llama, write_tokenizer  # noqa: E402

MAX_POSITIONS = 32768  # the largest max_model_len the seed docs pass


def make_checkpoint(path: Path, dtype: str = "float32"):
    """Write a tiny Llama at `path` whose config allows MAX_POSITIONS; dtype "float16" saves its
    tensors as float16 (config.json then names float16). Returns transformers' float32 model read
    back from `path` (for float16: the float16 values, exactly)."""
    import torch

    from transformers import LlamaForCausalLM

    hf = make_tiny_llama(path)
    if dtype == "float16":
        hf.half().save_pretrained(str(path))
        write_tokenizer(path)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = MAX_POSITIONS
    (path / "config.json").write_text(json.dumps(config, indent=2))
    # read back by transformers: float16 tensors upcast, RoPE frequencies computed afresh in float32
    return LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
