"""Reasoning parsers: FastDeploy 2.3's (reasoning_content, content) splits, per parser name.

Oracle: the rules of FastDeploy 2.3's `fastdeploy/reasoning/*` `extract_reasoning_content`
(reference report section 9 and the upstream sources, including the quoted examples of upstream
`tests/reasoning/test_reasoning_parser.py`), with the two documented qwen3 deviations (content ""
instead of None; a `<think>` after the first `</think>` does not discard the reasoning).
"""
import pytest

from fastdeploy.reasoning import REASONING_PARSERS, ReasoningParser, get_reasoning_parser
from fastdeploy.reasoning.ernie_45_vl_thinking_reasoning_parser import Ernie45VLThinkingReasoningParser
from fastdeploy.reasoning.ernie_vl_reasoning_parser import ErnieVLReasoningParser
from fastdeploy.reasoning.ernie_x1_reasoning_parser import ErnieX1ReasoningParser
from fastdeploy.reasoning.qwen3_reasoning_parser import Qwen3ReasoningParser

TOOL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

QWEN3 = [
    # (case id, text, expected (reasoning_content, content))
    ("no_tags", "Hello world", (None, "Hello world")),
    ("empty_text", "", (None, "")),
    ("only_start_tag", "<think>still thinking", (None, "<think>still thinking")),
    ("only_end_tag", "I think\n</think>\n\nAnswer ", ("I think", "Answer")),
    ("only_end_tag_empty_content", "I think</think>\n\n", ("I think", "")),
    ("only_end_tag_empty_reasoning", "</think>Answer", ("", "Answer")),
    ("both_tags", "<think>a</think>b", ("a", "b")),
    ("both_tags_newlines_kept", "<think>\nreason\n</think>\n\nanswer", ("\nreason\n", "\n\nanswer")),
    ("both_tags_empty_reasoning", "<think></think>answer", ("", "answer")),
    ("both_tags_empty_reasoning_qwen_template", "<think>\n\n</think>\n\nanswer", ("\n\n", "\n\nanswer")),
    ("both_tags_empty_content", "<think>a</think>", ("a", "")),
    ("text_before_start_tag_dropped", "pre<think>a</think>b", ("a", "b")),
    ("tool_call_after_reasoning", "<think>plan</think>\n\n" + TOOL, ("plan", "\n\n" + TOOL)),
    ("tool_call_only_end_tag", "plan\n</think>\n\n" + TOOL, ("plan", TOOL)),
    ("multiple_end_tags", "<think>a</think>b</think>c", ("a", "b</think>c")),
    ("multiple_end_tags_no_start", "a</think>b</think>c", ("a", "b</think>c")),
    ("start_tag_after_end_tag", "a</think>b<think>c", ("a", "b<think>c")),
]

ERNIE_45_VL = [
    ("no_tags", "Hello world", ("", "Hello world")),
    ("empty_text", "", ("", "")),
    ("only_end_tag", "abc</think>xyz", ("abc", "xyz")),
    ("both_tags_kept_verbatim", "<think>abc</think>xyz", ("<think>abc", "xyz")),
    ("empty_reasoning", "</think>xyz", ("", "xyz")),
    ("empty_content", "abc</think>", ("abc", "")),
    ("leading_newlines_kept", "abc\n</think>\n\nxyz", ("abc\n", "\n\nxyz")),
    ("tool_call_is_content", "plan</think>\n" + TOOL, ("plan", "\n" + TOOL)),
    ("multiple_end_tags", "a</think>b</think>c", ("a", "b</think>c")),
]

ERNIE_45_VL_THINKING = [
    ("no_tags_all_reasoning", "Hello world", ("Hello world", "")),
    ("empty_text", "", ("", "")),
    ("only_end_tag", "abc</think>xyz", ("abc", "xyz")),
    ("both_tags_kept_verbatim", "<think>abc</think>xyz", ("<think>abc", "xyz")),
    ("empty_reasoning", "</think>xyz", ("", "xyz")),
    ("empty_content", "abc</think>", ("abc", "")),
    ("newline_content_kept", "reasoning</think>\nresponse", ("reasoning", "\nresponse")),
    ("leading_newlines_kept", "reasoning</think>\n\nresponse\n", ("reasoning", "\n\nresponse\n")),
    ("tool_call_after_newline", "reasoning</think>\n<tool_call>...", ("reasoning", "")),
    ("tool_call_after_newlines", "reasoning</think>\n\n\n" + TOOL, ("reasoning", "")),
    ("tool_call_directly", "reasoning</think>" + TOOL + "\ntrailing", ("reasoning", "")),
    ("text_before_tool_call", "reasoning</think>\nLet me check.\n" + TOOL,
     ("reasoning", "\nLet me check.\n" + TOOL)),
    ("space_before_tool_call", "reasoning</think>\n " + TOOL, ("reasoning", "\n " + TOOL)),
    ("multiple_end_tags", "a</think>b</think>c", ("a", "b</think>c")),
    ("multiple_end_tags_then_tool_call", "a</think>\n<tool_call>b</think>c", ("a", "")),
]

ERNIE_X1 = [
    ("no_tags_all_reasoning", "no_thinking_here", ("no_thinking_here", "")),
    ("empty_text", "", ("", "")),
    ("reference_example", "abc\n</think>\n<response>hello\nworld</response>", ("abc\n", "hello\nworld")),
    ("newlines_preserved", "abc\n</think>\n<response>line1\nline2\n</response>", ("abc\n", "line1\nline2\n")),
    ("response_unterminated", "abc</think><response>partial response", ("abc", "partial response")),
    ("text_after_response_end_dropped", "abc</think><response>hi</response>\nextra", ("abc", "hi")),
    ("only_end_tag_no_response", "abc</think>\nplain answer", ("abc", "")),
    ("empty_reasoning", "</think>\n<response>hi</response>", ("", "hi")),
    ("empty_response", "abc</think>\n<response></response>", ("abc", "")),
    ("empty_content", "abc</think>", ("abc", "")),
    ("start_tag_kept", "<think>abc</think><response>hi</response>", ("<think>abc", "hi")),
    ("tool_call_no_response", "abc</think><tool_call>call_here", ("abc", "")),
    ("tool_call_before_response", "abc\n</think>\n" + TOOL + "\n<response>hi</response>", ("abc\n", "")),
    ("tool_call_after_response", "abc</think><response>hi</response>\n" + TOOL, ("abc", "hi")),
    ("tool_call_inside_response", "abc</think><response>see <tool_call>x</response>", ("abc", "see <tool_call>x")),
    ("multiple_end_tags", "a</think>b</think>\n<response>c</response>", ("a", "c")),
    ("multiple_end_tags_in_response", "a</think><response>b</think>c</response>", ("a", "b</think>c")),
]


def _ids(table):
    return [row[0] for row in table]


@pytest.mark.parametrize("case,text,expected", QWEN3, ids=_ids(QWEN3))
def test_qwen3(case, text, expected):
    assert Qwen3ReasoningParser().extract(text) == expected


@pytest.mark.parametrize("case,text,expected", ERNIE_45_VL, ids=_ids(ERNIE_45_VL))
def test_ernie_45_vl(case, text, expected):
    assert ErnieVLReasoningParser().extract(text) == expected


@pytest.mark.parametrize("case,text,expected", ERNIE_45_VL_THINKING, ids=_ids(ERNIE_45_VL_THINKING))
def test_ernie_45_vl_thinking(case, text, expected):
    assert Ernie45VLThinkingReasoningParser().extract(text) == expected


@pytest.mark.parametrize("case,text,expected", ERNIE_X1, ids=_ids(ERNIE_X1))
def test_ernie_x1(case, text, expected):
    assert ErnieX1ReasoningParser().extract(text) == expected


ALL_CASES = [
    (name, text) for name, table in (
        ("qwen3", QWEN3), ("ernie-45-vl", ERNIE_45_VL),
        ("ernie-45-vl-thinking", ERNIE_45_VL_THINKING), ("ernie-x1", ERNIE_X1),
    ) for _, text, _ in table
]


@pytest.mark.parametrize("name,text", ALL_CASES)
def test_types_and_no_invention(name, text):
    """Content is always a str, reasoning a str or None, and both are pieces of the input."""
    reasoning, content = get_reasoning_parser(name).extract(text)
    assert isinstance(content, str)
    assert reasoning is None or isinstance(reasoning, str)
    assert content in text
    assert reasoning is None or reasoning in text


def test_registry_names_and_classes():
    assert REASONING_PARSERS == {
        "qwen3": Qwen3ReasoningParser,
        "ernie-45-vl": ErnieVLReasoningParser,
        "ernie-45-vl-thinking": Ernie45VLThinkingReasoningParser,
        "ernie-x1": ErnieX1ReasoningParser,
    }
    for name, cls in REASONING_PARSERS.items():
        assert issubclass(cls, ReasoningParser) and cls.name == name


@pytest.mark.parametrize(
    "name,cls",
    [
        ("qwen3", Qwen3ReasoningParser),
        ("ernie-45-vl", ErnieVLReasoningParser),
        ("ernie_45_vl", ErnieVLReasoningParser),
        ("ernie-45-vl-thinking", Ernie45VLThinkingReasoningParser),
        ("ernie_45_vl_thinking", Ernie45VLThinkingReasoningParser),
        ("ernie-45-vl_thinking", Ernie45VLThinkingReasoningParser),
        ("ernie-x1", ErnieX1ReasoningParser),
        ("ernie_x1", ErnieX1ReasoningParser),
    ],
)
def test_get_reasoning_parser_dash_and_underscore(name, cls):
    parser = get_reasoning_parser(name)
    assert type(parser) is cls
    assert parser.extract("a</think>b") == cls().extract("a</think>b")


@pytest.mark.parametrize("name", ["deepseek-r1", "ERNIE-X1", "qwen", "", " qwen3", None])
def test_unknown_name_raises_value_error_listing_names(name):
    with pytest.raises(ValueError) as info:
        get_reasoning_parser(name)
    message = str(info.value)
    assert message.startswith("reasoning_parser")
    for valid in REASONING_PARSERS:
        assert valid in message
