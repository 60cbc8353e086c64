"""Tiny random Llama checkpoints written by transformers, with a byte-level tokenizer."""
import json
from pathlib import Path

VOCAB_SIZE = 512


def write_tokenizer(path: Path) -> None:
    """A byte-level BPE tokenizer with VOCAB_SIZE entries and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    corpus = ["The quick brown fox jumps over the lazy dog.", "Hello world! 你好，世界。", "def f(x): return x + 1"]
    tok.train_from_iterator(corpus * 50, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", pad_token="<|im_end|>")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast.save_pretrained(str(path))


def make_tiny_llama(path: Path, tie: bool = False, rope_style: str = "rope_parameters", seed: int = 0,
                    max_shard_size: str = "1GB", layers: int = 2):
    """Save a random `layers`-layer Llama (GQA 4:2) at `path`; returns the transformers model (float32).

    rope_style: where config.json keeps rope_theta: "rope_parameters" (transformers >= 5),
    "top_level", or "rope_scaling" (with llama3 scaling, as Llama 3.1 configs do).
    initializer_range 0.2 so greedy continuations vary instead of repeating one token.
    A small max_shard_size writes several safetensors shards with an index.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-5, initializer_range=0.2, tie_word_embeddings=tie,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    if rope_style == "rope_scaling":
        config.rope_parameters = {"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 64}
    else:
        config.rope_parameters = {"rope_type": "default", "rope_theta": 50000.0}
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(str(path), max_shard_size=max_shard_size)
    write_tokenizer(path)
    _rewrite_rope_config(path / "config.json", rope_style)
    return model


def _rewrite_rope_config(config_path: Path, rope_style: str) -> None:
    """Move rope settings to where older or other exporters put them."""
    cfg = json.loads(config_path.read_text())
    params = cfg.pop("rope_parameters", None) or {}
    if rope_style == "rope_parameters":
        cfg["rope_parameters"] = params
    elif rope_style == "top_level":
        cfg["rope_theta"] = params["rope_theta"]
    elif rope_style == "rope_scaling":
        cfg["rope_theta"] = params.pop("rope_theta")
        cfg["rope_scaling"] = params
    config_path.write_text(json.dumps(cfg, indent=2))
