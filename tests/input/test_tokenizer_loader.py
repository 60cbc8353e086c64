"""tokenizer_loader.load_model_tokenizer on directories that AutoTokenizer alone does not read as the
model means: no declared tokenizer class, another sentencepiece file name and no config.json, a
tokenizer.json beside remote code under an unknown model type, added tokens past the sentencepiece
vocabulary, and sentencepiece normalizer settings other than ERNIE's.
"""
import json

import pytest

from fastdeploy.input.tokenizer_loader import load_model_tokenizer

from tokenizer_dirs import ERNIE_PROMPT, MESSAGES, TEXTS, train_sentencepiece, write_ernie_tokenizer


def test_ernie_without_declared_class_replaces_the_generic_conversion(ernie_spm, sp, tmp_path):
    """config.json says ernie4_5 and tokenizer_config.json names no class: AutoTokenizer converts generically."""
    path = write_ernie_tokenizer(tmp_path / "plain", ernie_spm)
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["tokenizer_class"], config["auto_map"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    from transformers import AutoTokenizer, TokenizersBackend

    generic = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    assert type(generic) is TokenizersBackend  # (transformers 5.23 also spelled "<mask:2>" out; 5.24 does not)
    tok = load_model_tokenizer(path)
    assert type(tok) is not TokenizersBackend
    assert tok.encode("x<mask:2>y<|im_start|>", add_special_tokens=False) == sp.encode("x<mask:2>y<|im_start|>")
    assert tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=False) \
        .endswith("<think>\n\n</think>\n\n")


def test_other_sentencepiece_file_name_and_no_config_json(ernie_spm, sp, tmp_path, caplog):
    """FastDeploy also reads `spm.model`; AutoTokenizer fails on this directory, the fallback builds it."""
    path = write_ernie_tokenizer(tmp_path / "spm", ernie_spm, config_json=False)
    (path / "tokenizer.model").rename(path / "spm.model")
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["tokenizer_class"], config["auto_map"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    with caplog.at_level("INFO", logger="fastdeploy.input.tokenizer_loader"):
        tok = load_model_tokenizer(path)
    assert "AutoTokenizer could not load" in caplog.text
    assert tok.encode(TEXTS[3], add_special_tokens=False) == sp.encode(TEXTS[3])
    assert not (path / "REMOTE_CODE_RAN").exists()


def test_tokenizer_json_with_remote_code_and_unknown_model_type(ernie_tok, ernie_spm, sp, tmp_path, caplog):
    """A `-PT`-style directory (tokenizer.json beside tokenizer.model) whose model type transformers does not
    override (here ERNIE-VL's), so AutoTokenizer refuses the auto_map: tokenizer.json is read without it."""
    path = write_ernie_tokenizer(tmp_path / "vl", ernie_spm, "jinja", config_json=False)
    (path / "config.json").write_text(json.dumps({"model_type": "ernie4_5_moe_vl"}))
    ernie_tok.backend_tokenizer.save(str(path / "tokenizer.json"))
    with caplog.at_level("INFO", logger="fastdeploy.input.tokenizer_loader"):
        tok = load_model_tokenizer(path)
    assert "reading its tokenizer.json" in caplog.text
    for text in TEXTS + ["a<mask:2>b<|end_of_sentence|>"]:
        assert tok.encode(text, add_special_tokens=False) == sp.encode(text)
    assert tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=False) \
        == ERNIE_PROMPT + "<think>\n\n</think>\n\n"
    assert not (path / "REMOTE_CODE_RAN").exists() and "auto_map" not in tok.init_kwargs


def test_added_tokens_past_the_sentencepiece_vocab_keep_their_ids(ernie_spm, sp, tmp_path):
    path = write_ernie_tokenizer(tmp_path / "added", ernie_spm, "jinja")
    config = json.loads((path / "tokenizer_config.json").read_text())
    n = sp.vocab_size()
    config["added_tokens_decoder"][str(n)] = {"content": "<|IMAGE_PLACEHOLDER|>", "special": True, "normalized": False}
    config["added_tokens_decoder"][str(n + 2)] = {"content": "<tool_call>", "special": False, "normalized": False}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_model_tokenizer(path)
    assert tok.convert_tokens_to_ids(["<|IMAGE_PLACEHOLDER|>", "<tool_call>"]) == [n, n + 2]
    ids = tok.encode("a<|IMAGE_PLACEHOLDER|>b<tool_call>c", add_special_tokens=False)
    assert n in ids and n + 2 in ids
    assert tok.decode(ids, skip_special_tokens=True) == "ab<tool_call>c"


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_normalizer_settings_are_followed(model_type, tmp_path):
    """A model with nmt_nfkc, a dummy prefix and whitespace cleanup (not ERNIE's) still encodes like sentencepiece."""
    import sentencepiece as spm

    model = train_sentencepiece(model_type, vocab_size=500, ernie=False)
    oracle = spm.SentencePieceProcessor(model_proto=model)
    path = tmp_path / "nfkc"
    path.mkdir()
    (path / "tokenizer.model").write_bytes(model)
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "SomeRemoteTokenizer",
                                                            "auto_map": {"AutoTokenizer": ["x.Y", None]}}))
    tok = load_model_tokenizer(path)
    for text in TEXTS + ["Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "   leading and trailing   "]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == oracle.encode(text), text
        assert tok.decode(ids) == oracle.decode(ids), text
    # Text is split at added tokens first and each run is encoded on its own (dummy prefix included),
    # as the slow remote tokenizers (ERNIE's among them) do for the tokens they register.
    mask = oracle.piece_to_id("<mask:0>")
    assert tok.encode("a<mask:0>b", add_special_tokens=False) == oracle.encode("a") + [mask] + oracle.encode("b")
    assert tok.encode("x<cls>y", add_special_tokens=False) == \
        oracle.encode("x") + [oracle.piece_to_id("<cls>")] + oracle.encode("y")

