"""Each tool parser against its model family's documented call format.

Oracles: the arguments are the JSON objects written into the texts here (compared after
json.loads, so key order and spacing do not matter); the formats are the documented ones:
ERNIE-4.5 thinking (FastDeploy's tool-calling docs and its parsers' docstrings:
`abc\\n</think>\\n\\n\\n<tool_call>\\n{...}\\n</tool_call>\\n`), Qwen3 (Qwen's function-calling docs and
chat template: `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` after `</think>`),
Hermes 2 Pro (its model card: `<tool_call>\\n{"arguments": {...}, "name": ...}\\n</tool_call>`).
"""
import json
import re

import pytest

from fastdeploy.tool_parsers import TOOL_PARSERS, get_tool_parser

ALL = sorted(TOOL_PARSERS)
WEATHER = {"location": "北京", "unit": "c"}  # FastDeploy's docs' example call
NESTED = {"query": {"filters": [{"field": "price", "lt": 9.5}, {"field": "tags", "in": ["a", "b"]}],
                    "sort": None, "limit": 3, "exact": True}}


def block(name, arguments=None, *, arguments_first=False) -> str:
    body = {"name": name} if arguments is None else (
        {"arguments": arguments, "name": name} if arguments_first else {"name": name, "arguments": arguments})
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def calls(found):
    return [(c.function.name, json.loads(c.function.arguments)) for c in found.tool_calls]


@pytest.mark.parametrize("name", ALL)
def test_registry_returns_the_named_parser(name):
    parser = get_tool_parser(name.replace("-", "_"))
    assert type(parser) is TOOL_PARSERS[name] and parser.name == name


@pytest.mark.parametrize("bad", ["mistral", "QWEN3", "", None, 3])
def test_unknown_names_list_the_valid_ones(bad):
    with pytest.raises(ValueError, match=r"^tool_call_parser ") as info:
        get_tool_parser(bad)
    assert all(name in str(info.value) for name in ALL)


# ---- the documented formats -------------------------------------------------------------------
def test_ernie_x1_thinking_then_one_call():
    text = f"用户想知道天气\n</think>\n\n\n{block('get_weather', WEATHER)}\n"
    found = get_tool_parser("ernie-x1").extract_tool_calls(text)
    assert found.tools_called and calls(found) == [("get_weather", WEATHER)]
    assert found.content == "用户想知道天气\n</think>"  # the text outside the block, stripped


def test_ernie_45_vl_thinking_calls_must_open_the_answer():
    parser = get_tool_parser("ernie-45-vl-thinking")
    found = parser.extract_tool_calls(f"look at the image</think>\n\n{block('zoom', {'x': 1})}")
    assert calls(found) == [("zoom", {"x": 1})]
    text = f"look</think>\nFirst I answer. {block('zoom', {'x': 1})}"
    assert parser.extract_tool_calls(text).tools_called is False
    assert parser.extract_tool_calls(text).content == text
    # the other parsers take the call after text
    assert calls(get_tool_parser("ernie-x1").extract_tool_calls(text)) == [("zoom", {"x": 1})]


def test_qwen3_thinking_then_parallel_calls():
    text = ("<think>\nI need both temperatures.\n</think>\n\n"
            + block("get_current_temperature", {"location": "San Francisco, CA, USA"}) + "\n"
            + block("get_temperature_date", {"location": "San Francisco, CA, USA", "date": "2024-10-01"}))
    found = get_tool_parser("qwen3").extract_tool_calls(text)
    assert calls(found) == [("get_current_temperature", {"location": "San Francisco, CA, USA"}),
                            ("get_temperature_date", {"location": "San Francisco, CA, USA", "date": "2024-10-01"})]
    assert found.content == "<think>\nI need both temperatures.\n</think>"


def test_hermes_arguments_before_name():
    found = get_tool_parser("hermes").extract_tool_calls(
        block("get_stock_fundamentals", {"symbol": "TSLA"}, arguments_first=True))
    assert calls(found) == [("get_stock_fundamentals", {"symbol": "TSLA"})] and found.content is None


# ---- the common rules, every parser -----------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_no_call_keeps_the_text(name):
    text = "The weather in Paris is sunny."
    found = get_tool_parser(name).extract_tool_calls(text)
    assert (found.tools_called, found.tool_calls, found.content) == (False, [], text)


@pytest.mark.parametrize("name", ALL)
def test_several_calls_no_arguments_nested_and_unicode(name):
    text = "\n" + block("now") + "\n" + block("search", NESTED) + block("翻译", {"text": "你好 🌍", "to": "ja"})
    found = get_tool_parser(name).extract_tool_calls(text)
    assert calls(found) == [("now", {}), ("search", NESTED), ("翻译", {"text": "你好 🌍", "to": "ja"})]
    assert found.content is None
    assert "你好 🌍" in found.tool_calls[2].function.arguments  # ensure_ascii=False: no \\u escapes


@pytest.mark.parametrize("name", ALL)
def test_ids_are_call_and_random_hex(name):
    found = get_tool_parser(name).extract_tool_calls(block("a", {}) + block("b", {}))
    ids = [c.id for c in found.tool_calls]
    assert all(re.fullmatch(r"call_[0-9a-f]{32}", i) for i in ids) and len(set(ids)) == 2
    assert all(c.type == "function" for c in found.tool_calls)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("body", ['{"name": "f", "arguments": {"a": 1}', '{"name": "f", "arguments": {a: 1}}',
                                  '{"arguments": {"a": 1}}', '["f", {"a": 1}]', '{"name": "", "arguments": {}}',
                                  '{"name": "f", "arguments": "{\\"a\\": 1}"}'])
def test_bad_json_in_a_block_is_no_call_and_keeps_the_text(name, body):
    text = f"</think>\n\n{block('good', {'x': 1})}\n<tool_call>\n{body}\n</tool_call>"
    found = get_tool_parser(name).extract_tool_calls(text)
    assert (found.tools_called, found.tool_calls, found.content) == (False, [], text)


@pytest.mark.parametrize("name", ["ernie-x1", "qwen3", "hermes"])
def test_text_before_and_after_the_calls_is_the_content(name):
    text = f"Let me check.\n{block('get_weather', WEATHER)}\nOne moment."
    found = get_tool_parser(name).extract_tool_calls(text)
    assert calls(found) == [("get_weather", WEATHER)]
    assert found.content == "Let me check.\n\nOne moment."


@pytest.mark.parametrize("name", ALL)
def test_a_call_inside_the_thinking_is_no_call(name):
    thought = f"<think>maybe {block('wrong', {})}?\n</think>\n\n"
    assert get_tool_parser(name).extract_tool_calls(thought + "No tool needed.").tools_called is False
    found = get_tool_parser(name).extract_tool_calls(thought + block("right", {"k": [1, 2]}))
    assert calls(found) == [("right", {"k": [1, 2]})]


@pytest.mark.parametrize("name", ALL)
def test_an_unclosed_last_block_counts_only_when_its_json_is_complete(name):
    parser = get_tool_parser(name)
    assert calls(parser.extract_tool_calls('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n')) == [("f", {"a": 1})]
    cut = '<tool_call>\n{"name": "f", "arguments": {"a": '  # max_tokens ran out
    assert parser.extract_tool_calls(cut).tools_called is False


# ---- what the output processor asks: calls after the reasoning split ---------------------------
@pytest.mark.parametrize("name", ALL)
def test_parse_completion_reads_only_the_answer(name):
    parser = get_tool_parser(name)
    full = f"plan {block('wrong', {})}</think>\n\n{block('right', {'a': 1})}"
    # a reasoning parser split off "plan ..." (its answer may be "" for ernie's: the calls are still read)
    tool_calls, text = parser.parse_completion(full, f"plan {block('wrong', {})}", "")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls] == [("right", {"a": 1})]
    assert text == ""
    # no reasoning parser: the thinking stays in text, the call leaves it
    tool_calls, text = parser.parse_completion(full, None, full)
    assert [c.function.name for c in tool_calls] == ["right"] and text == f"plan {block('wrong', {})}</think>"


@pytest.mark.parametrize("name", ALL)
def test_parse_completion_when_the_end_of_thinking_was_a_dropped_special_token(name):
    # `</think>` was a special token dropped by skip_special_tokens: the reasoning opens the text
    tool_calls, text = get_tool_parser(name).parse_completion(f"thinking\n\n{block('f', {})}", "thinking", "")
    assert [c.function.name for c in tool_calls] == ["f"] and text == ""


@pytest.mark.parametrize("name", ALL)
def test_parse_completion_without_calls_keeps_the_answer(name):
    assert get_tool_parser(name).parse_completion("r</think>plain answer", "r", "plain answer") == (None, "plain answer")
