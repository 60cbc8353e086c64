"""The ERNIE-4.5 tokenizer loaded offline from its model directory (tokenizer_loader.load_model_tokenizer),
in both tokenizer_config.json layouts (tokenizer_dirs.py), against sentencepiece on the same model file:
encoding, special and user-defined pieces, decoding, streaming detokenization, the chat template's
`enable_thinking`, and the remote tokenizer code that must never run.
"""
import json

import pytest

from tokenizer_dirs import ERNIE_PROMPT, MESSAGES, TEXTS


@pytest.mark.parametrize("text", TEXTS)
def test_ernie_encodes_like_sentencepiece(ernie_tok, sp, text):
    ids = ernie_tok.encode(text, add_special_tokens=False)
    assert ids == sp.encode(text)
    assert ernie_tok.encode(text) == ids, "ERNIE never adds BOS/EOS"
    assert ernie_tok(text)["input_ids"] == ids
    assert ernie_tok.decode(ids) == sp.decode(ids) == text


def test_ernie_special_and_user_defined_pieces(ernie_tok, sp):
    tok = ernie_tok
    for name, piece in [("bos_token", "<s>"), ("eos_token", "</s>"), ("unk_token", "<unk>"),
                        ("cls_token", "<|begin_of_sentence|>"), ("sep_token", "<|end_of_sentence|>"),
                        ("mask_token", "<mask:1>")]:
        assert getattr(tok, name) == piece
        assert getattr(tok, name + "_id") == sp.piece_to_id(piece)
    assert tok.eos_token_id == 2
    for piece in ["<mask:4>", "<mask:7>", "<|begin_of_sentence|>"]:
        assert piece in tok.all_special_tokens
    # sentencepiece's user-defined pieces are one id each, as in ERNIE's tokenizer
    for piece in ["<mask:2>", "<cls>", "<|im_start|>", "<think>", "</think>"]:
        assert tok.encode(f"a{piece}b", add_special_tokens=False) == sp.encode(f"a{piece}b")
        assert len(tok.encode(piece, add_special_tokens=False)) == 1
    assert len(tok) == sp.vocab_size()


def test_ernie_decode_keeps_or_drops_special_tokens(ernie_tok):
    text = "<|begin_of_sentence|>User: 你好 🦙\nAssistant: <think>\nok\n</think>\n\nHi there!<|end_of_sentence|></s>"
    ids = ernie_tok.encode(text, add_special_tokens=False)
    assert ernie_tok.decode(ids, skip_special_tokens=False) == text  # joined verbatim, no spaces added
    assert ernie_tok.decode(ids, skip_special_tokens=True) == \
        "User: 你好 🦙\nAssistant: <think>\nok\n</think>\n\nHi there!"
    assert ernie_tok.decode(ids[-3:], skip_special_tokens=True) == "!"


def test_ernie_streaming_detokenizer_matches_decode(ernie_tok):
    from fastdeploy.output.detokenizer import IncrementalDetokenizer

    prompt = ernie_tok.encode(ERNIE_PROMPT, add_special_tokens=False)
    answer = ernie_tok.encode("你好！emoji 🦙👍🏽 and  spaces.<|end_of_sentence|>", add_special_tokens=False)
    detok = IncrementalDetokenizer(ernie_tok, prompt, skip_special_tokens=True)
    for token_id in answer:
        detok.add_token(token_id)
    assert detok.text == ernie_tok.decode(answer, skip_special_tokens=True) == "你好！emoji 🦙👍🏽 and  spaces."


def test_ernie_chat_template_honours_enable_thinking(ernie_tok):
    def apply(**kwargs):
        return ernie_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, **kwargs)

    assert apply(enable_thinking=False) == ERNIE_PROMPT + "<think>\n\n</think>\n\n"
    assert apply(enable_thinking=True) == ERNIE_PROMPT + "<think>\n"
    assert apply() == ERNIE_PROMPT + "<think>\n"
    history = MESSAGES + [{"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks"}]
    assert ernie_tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True, enable_thinking=False) \
        == ERNIE_PROMPT + "4<|end_of_sentence|>User: Thanks\nAssistant: <think>\n\n</think>\n\n"


def test_ernie_remote_code_is_never_run(ernie_dir, ernie_tok):
    from transformers import TokenizersBackend

    assert not (ernie_dir / "REMOTE_CODE_RAN").exists()
    assert isinstance(ernie_tok, TokenizersBackend)
    assert "auto_map" not in ernie_tok.init_kwargs
    saved = ernie_dir.parent / (ernie_dir.name + "_saved")
    ernie_tok.save_pretrained(str(saved))
    assert "auto_map" not in json.loads((saved / "tokenizer_config.json").read_text())

