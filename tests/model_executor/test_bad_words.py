"""Bad words (input/bad_words.py, layers/sample/bad_words.py): the token sequences of each word (as given and with a
leading space), the tokens banned at each step (vLLM's rule: the last token of a word whose prefix
ends the output), with a fake and with the real tokenizer, and generate() never emitting one.
"""
import fastdeploy  # noqa: F401  (before paddle)
import pytest

from fastdeploy.input.bad_words import bad_words_token_ids
from fastdeploy.model_executor.layers.sample import bad_words


class FakeTokenizer:
    VOCAB = {"foo": [5], " foo": [6], "foo bar": [5, 7], " foo bar": [6, 7], "  foo bar": [3, 6, 7], "a b c": [1, 2, 3],
             " a b c": [9, 2, 3], "huge": [900], " huge": [901], "odd": [], " odd": [4]}

    def encode(self, text, add_special_tokens=False):
        assert add_special_tokens is False
        return list(self.VOCAB[text])


def test_bad_words_token_ids_tokenizes_each_word_as_given_and_with_a_leading_space():
    seqs = bad_words_token_ids(FakeTokenizer(), ["foo", "  foo bar", "a b c", "huge", "odd"], [8, 5], 500)
    # "  foo bar": as given, and with exactly one leading space (" foo bar"); "odd" as given is empty
    assert set(seqs) == {(5,), (6,), (3, 6, 7), (6, 7), (1, 2, 3), (9, 2, 3), (4,), (8,)}
    assert seqs == sorted(set(seqs))  # no duplicates ((5,) from both "foo" and extra id 5)


def test_bad_words_token_ids_drops_words_outside_the_vocabulary():
    assert bad_words_token_ids(FakeTokenizer(), ["huge"], [], 500) == []
    assert bad_words_token_ids(FakeTokenizer(), ["huge"], [], 902) == [(900,), (901,)]


@pytest.mark.parametrize(
    "output, expected",
    [
        ([], {5, 6}),  # one-token words always; nothing to continue yet
        ([6], {5, 6, 7}),  # output ends with " foo": " foo bar" would complete -> ban 7
        ([1, 2], {5, 6, 3}),  # ends with "a b" -> ban 3
        ([9, 2], {5, 6, 3}),
        ([1, 2, 8], {5, 6}),  # the prefix is not at the end
        ([2], {5, 6}),  # only part of the prefix
        ([6, 7, 1], {5, 6}),
        ([4, 6, 1, 2], {5, 6, 3}),
    ],
)
def test_banned_now_bans_the_last_token_of_a_word_whose_prefix_ends_the_output(output, expected):
    seqs = [(5,), (6,), (6, 7), (1, 2, 3), (9, 2, 3)]
    assert set(bad_words.banned_now(seqs, output)) == expected


def test_bad_words_with_the_real_tokenizer(smollm_llm):
    tokenizer = smollm_llm.get_tokenizer()
    vocab = smollm_llm.llm_engine.config.model_config.vocab_size
    words = ["Paris", "New York", "ineffable"]
    seqs = bad_words_token_ids(tokenizer, words, [], vocab)
    expected = {tuple(tokenizer.encode(v, add_special_tokens=False)) for w in words for v in (w, " " + w)}
    assert set(seqs) == expected
    assert any(len(s) > 1 for s in seqs)
    singles = {s[0] for s in seqs if len(s) == 1}
    assert set(bad_words.banned_now(seqs, [])) == singles
    for seq in seqs:
        assert set(bad_words.banned_now(seqs, [11] + list(seq[:-1]))) >= {seq[-1], *singles}
        if len(seq) > 1:  # only part of the prefix generated: seq does not ban its last token
            assert bad_words.banned_now([seq], [11] + list(seq[1:-1])) == []


def test_generate_never_emits_a_bad_word(smollm_llm):
    from fastdeploy import SamplingParams

    prompt = "The capital of France is the city of"
    tokenizer = smollm_llm.get_tokenizer()
    plain = smollm_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0]
    assert "Paris" in plain.outputs.text  # the word the ban must remove
    seqs = bad_words_token_ids(tokenizer, ["Paris"], [], len(tokenizer))
    banned = smollm_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6, bad_words=["Paris"]),
                                 use_tqdm=False)[0]
    ids = banned.outputs.token_ids
    for seq in seqs:
        assert not any(tuple(ids[i:i + len(seq)]) == seq for i in range(len(ids))), (seq, ids)

