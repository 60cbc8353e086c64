"""Incremental detokenization and stop-string search on the default model's tokenizer.

Oracle: `tokenizer.decode(ids)` of the whole sequence. Feeding the ids one at a time must give
pieces that add up to exactly that text, and no piece may show a replacement character for a
multi-byte character that a later token completes. Both paths are checked: the fast tokenizer's
DecodeStream and the window path used for slow (sentencepiece) tokenizers.
"""
import pytest

from fastdeploy.output.detokenizer import IncrementalDetokenizer
from fastdeploy.output.stop_checker import _find_stop_string

TEXTS = {
    "chinese": "你好，世界！今天天气很好。我们去公园散步吧",
    "emoji": "🎉👍🏽 party 🇫🇷 ok 😀😀",
    "accents": "Crème brûlée à la façon de Zoë, naïve café, Ærøskøbing, São Paulo",
    "code": "def f(x):\n    return {'a': [x**2 for x in range(3)]}  # ok\n\tif x != y:\n\t\tpass",
    "mixed": "Tokyo 東京 • Москва — 서울 ✓ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ½ €5",
}
IM_END = 2  # <|im_end|>, a special token


class SlowTokenizer:
    """The default tokenizer seen as a slow one: only `decode` (what the window path needs)."""

    is_fast = False

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id

    def decode(self, ids, skip_special_tokens=False):
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


@pytest.fixture(scope="module")
def tokenizer(smollm_llm):
    tok = smollm_llm.get_tokenizer()
    assert tok.is_fast  # the default path is DecodeStream
    return tok


def _feed(tokenizer, prompt_ids, ids, skip_special_tokens=True):
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
    pieces = [detok.add_token(t) for t in ids]
    assert detok.text == "".join(pieces)
    return pieces


def _wrap(tokenizer, slow):
    return SlowTokenizer(tokenizer) if slow else tokenizer


@pytest.mark.parametrize("slow", [False, True], ids=["fast", "window"])
@pytest.mark.parametrize("name", sorted(TEXTS))
def test_pieces_add_up_to_the_full_decode(tokenizer, name, slow):
    ids = tokenizer.encode(TEXTS[name], add_special_tokens=False)
    # the texts do split characters over several byte-level tokens (else the test proves little)
    if name in ("chinese", "emoji", "mixed"):
        assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    pieces = _feed(_wrap(tokenizer, slow), [], ids)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True) == TEXTS[name]
    assert not any("\ufffd" in p for p in pieces), pieces


@pytest.mark.parametrize("slow", [False, True], ids=["fast", "window"])
def test_pieces_after_a_prompt_hold_only_the_generated_text(tokenizer, slow):
    """With a prompt as left context, the pieces are the text the generated ids add to it, for
    every split of the sequence that leaves the prompt on a character boundary."""
    text = "Réponse: 你好 🎉 done, naïve!"
    ids = tokenizer.encode(text, add_special_tokens=False)
    splits = 0
    for k in range(1, len(ids)):
        prompt_text = tokenizer.decode(ids[:k])
        if "\ufffd" in prompt_text:
            continue
        splits += 1
        pieces = _feed(_wrap(tokenizer, slow), ids[:k], ids[k:])
        assert "".join(pieces) == text[len(prompt_text):], k
        assert not any("\ufffd" in p for p in pieces), (k, pieces)
    assert splits >= 8


@pytest.mark.parametrize("slow", [False, True], ids=["fast", "window"])
def test_special_tokens_are_skipped_or_kept_as_asked(tokenizer, slow):
    ids = tokenizer.encode("Hi 👋🏽 there", add_special_tokens=False) + [IM_END]
    skipped = _feed(_wrap(tokenizer, slow), [], ids, skip_special_tokens=True)
    kept = _feed(_wrap(tokenizer, slow), [], ids, skip_special_tokens=False)
    assert "".join(skipped) == tokenizer.decode(ids, skip_special_tokens=True) == "Hi 👋🏽 there"
    assert "".join(kept) == tokenizer.decode(ids, skip_special_tokens=False) == "Hi 👋🏽 there<|im_end|>"
    assert skipped[-1] == "" and kept[-1] == "<|im_end|>"


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_two_tokens_is_found_only_when_completed(tokenizer, include):
    """Feed the ids like the engine does; the search runs on the tail each new piece can complete."""
    text = "Hello world, goodbye moon"
    ids = tokenizer.encode(text, add_special_tokens=False)
    stop = "o wor"  # ends inside " world", starts inside "Hello"
    # it spans a token boundary: no single token's text contains it
    assert not any(stop in tokenizer.decode([t]) for t in ids)
    completes_at = next(k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k]))
    assert completes_at >= 2
    detok = IncrementalDetokenizer(tokenizer, [], True)
    found = []
    for k, t in enumerate(ids, start=1):
        piece = detok.add_token(t)
        match = _find_stop_string(detok.text, len(piece), [stop], include) if piece else None
        if match is not None:
            found.append((k, match))
    position = text.index(stop)
    expected_cut = position + len(stop) if include else position
    # reported once, at the token that completes it; later tokens cannot complete it again
    assert found == [(completes_at, (stop, expected_cut))]


def test_find_stop_string_picks_the_earliest_start_among_those_the_tail_completes():
    text = "abc thriving metropolis"
    new_len = len(" metropolis")  # the last piece completes both stop strings
    stops = ["tropolis", "thriving metro", "zzz"]
    assert _find_stop_string(text, new_len, stops, False) == ("thriving metro", 4)
    assert _find_stop_string(text, new_len, stops, True) == ("thriving metro", 4 + len("thriving metro"))
    # a stop string wholly inside the old text is not found again
    assert _find_stop_string(text + " and more", len(" and more"), stops, False) is None
    # one character of new text can complete a long stop string
    assert _find_stop_string("xx stop", 1, ["stop"], False) == ("stop", 3)
    assert _find_stop_string("xx sto", 1, ["stop"], False) is None
