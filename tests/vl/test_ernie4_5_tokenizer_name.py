"""fastdeploy.input.ernie4_5_tokenizer.Ernie4_5Tokenizer (the seeds' generate example imports it) against
transformers' AutoTokenizer on the same directory."""
import pytest

from fastdeploy.input.ernie4_5_tokenizer import Ernie4_5Tokenizer

MESSAGES = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}},
                                         {"type": "text", "text": "What is in the picture?"}]}]


def test_matches_transformers(vl_dir):
    from transformers import AutoTokenizer

    ours, ref = Ernie4_5Tokenizer.from_pretrained(str(vl_dir)), AutoTokenizer.from_pretrained(vl_dir)
    # the generation prompt is on by default, as in FastDeploy's class
    assert ours.apply_chat_template(MESSAGES, tokenize=False) == ref.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(MESSAGES, add_generation_prompt=False).endswith("picture?\n")
    assert ours.encode("time: 00:00:01.50", add_special_tokens=False) == ref.encode("time: 00:00:01.50",
                                                                                   add_special_tokens=False)
    assert ours.convert_tokens_to_ids("<|IMAGE_START|>") == 6 and ours.eos_token == "</s>"


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a local directory"):
        Ernie4_5Tokenizer.from_pretrained(tmp_path / "nope")
