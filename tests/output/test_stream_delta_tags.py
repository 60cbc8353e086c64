"""stream_delta.without_partial_tag: what a reasoning parser may read of a running completion.

Oracle: the definition, checked by brute force: the result is the longest prefix of the text
whose removed tail is a proper prefix of some tag (a whole tag, or text that cannot grow into
one, is kept)."""
import itertools

import pytest

from fastdeploy.output.stream_delta import without_partial_tag

TAGS = ("<think>", "</think>", "<response>")


@pytest.mark.parametrize("text, kept", [
    ("abc</thi", "abc"), ("abc<", "abc"), ("abc</think>", "abc</think>"), ("abc<think>", "abc<think>"),
    ("abc", "abc"), ("", ""), ("a</think>d<res", "a</think>d"), ("x</tHink", "x</tHink"), ("<", ""),
])
def test_cases(text, kept):
    assert without_partial_tag(text, TAGS) == kept


def test_against_the_definition():
    alphabet = "<>/thinkx"
    for n in range(0, 6):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            cuts = [i for i in range(len(text)) if any(len(text[i:]) < len(t) and t.startswith(text[i:]) for t in TAGS)]
            assert without_partial_tag(text, TAGS) == (text[:min(cuts)] if cuts else text), text


def test_no_tags():
    assert without_partial_tag("abc<", ()) == "abc<"
