"""A tiny random ERNIE-4.5 saved with the ERNIE tokenizer files (tokenizer_dirs.py): LLM loads it and
chats through its tokenizer, and the engine's tokenizer keeps the user-defined pieces.
"""
from pathlib import Path

import pytest

from fastdeploy.input.tokenizer_loader import load_model_tokenizer

from tokenizer_dirs import ERNIE_PROMPT, MESSAGES, write_ernie_tokenizer


# ---- end to end: a tiny random ERNIE-4.5 with the ERNIE tokenizer files ------------------------
@pytest.fixture(scope="module")
def tiny_ernie_dir(ernie_spm, sp, tmp_path_factory) -> Path:
    import torch
    from transformers import Ernie4_5Config, Ernie4_5ForCausalLM

    torch.manual_seed(0)
    config = Ernie4_5Config(
        vocab_size=sp.vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        use_bias=False, tie_word_embeddings=True, rms_norm_eps=1e-5, initializer_range=0.2,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    path = tmp_path_factory.mktemp("tiny_ernie")
    Ernie4_5ForCausalLM(config).eval().save_pretrained(str(path))
    return write_ernie_tokenizer(path, ernie_spm, "jinja")


def test_tiny_ernie_loads_and_chats_through_llm(tiny_ernie_dir, sp):
    from fastdeploy import LLM, SamplingParams

    ours = load_model_tokenizer(tiny_ernie_dir)
    assert len(ours) == sp.vocab_size()
    llm = LLM(model=str(tiny_ernie_dir), max_model_len=256, num_gpu_blocks_override=16)
    engine_side = llm.get_tokenizer()  # what the engine loaded from the directory itself
    assert engine_side.eos_token_id == ours.eos_token_id == 2
    assert len(engine_side) == len(ours)
    outputs = llm.chat(MESSAGES, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                       use_tqdm=False, chat_template_kwargs={"enable_thinking": False})
    out = outputs[0]
    assert out.prompt == ERNIE_PROMPT + "<think>\n\n</think>\n\n"
    assert out.prompt_token_ids == ours.encode(out.prompt, add_special_tokens=False) == sp.encode(out.prompt)
    assert len(out.outputs.token_ids) == 8
    assert all(0 <= t < sp.vocab_size() for t in out.outputs.token_ids)
    assert out.outputs.text == ours.decode(out.outputs.token_ids, skip_special_tokens=True)
    assert not (tiny_ernie_dir / "REMOTE_CODE_RAN").exists()


def test_engine_tokenizer_keeps_user_defined_pieces(tiny_ernie_dir, sp):
    from fastdeploy.input.tokenizer import load_tokenizer
    from fastdeploy.model_executor.model_loader import open_model

    engine_side = load_tokenizer(open_model(str(tiny_ernie_dir))[1])  # the engine's own path to it
    assert engine_side.encode("a<mask:2>b<|im_start|>", add_special_tokens=False) == sp.encode("a<mask:2>b<|im_start|>")
