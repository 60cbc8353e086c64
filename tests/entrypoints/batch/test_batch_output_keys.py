"""The output-control body keys of a batch line (response_format, vLLM's guided_* / structured_outputs /
guided_decoding_backend, FastDeploy's structural_tag, logit_bias, allowed_token_ids,
logits_processors_args, tools / tool_choice) and the tool calls of the output record. No model.

Oracles: SamplingParams / GuidedDecodingParams built here by hand from the documented mapping
(docs/batch_format.md), the tools' own parameter schemas, OpenAI's documented record shape, and a
deterministic fuzz (whatever the values, only BatchLineError naming a key comes out)."""
import json
import random
import re

import pytest

from fastdeploy import SamplingParams
from fastdeploy.engine.request import CompletionOutput, CompletionOutputs, RequestMetrics, RequestOutput, ToolCall
from fastdeploy.engine.sampling_params import GuidedDecodingParams
from fastdeploy.entrypoints.batch import constraints
from fastdeploy.entrypoints.batch.format import BatchLineError, parse_request_line, response_record
from fastdeploy.tool_parsers.tool_choice import tool_choice_schema

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSGS = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
NOW = {"type": "function", "function": {"name": "now"}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def parse(url=CHAT, **body):
    body = {"messages": MSGS, **body} if url == CHAT else {"prompt": "Once", **body}
    return parse_request_line(json.dumps({"custom_id": "r1", "url": url, "body": body}), 5)


def guided(url=CHAT, **body):
    return parse(url, **body).sampling_params.guided_decoding


def fails(*words, url=CHAT, code="invalid_parameter", **body):
    with pytest.raises(BatchLineError) as info:
        parse(url, **body)
    e = info.value
    assert (e.code, e.line, e.custom_id) == (code, 5, "r1"), e
    for w in words:
        assert w in e.message, (w, e.message)
    return e.message


def json_schema(**spec):
    return {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, **spec}}


# ---- response_format -----------------------------------------------------------------------------
@pytest.mark.parametrize("url", [CHAT, COMP])
def test_response_format_mapped(url):
    assert guided(url, response_format={"type": "text"}) is None
    assert parse(url, response_format={"type": "text"}).constraint_key is None
    assert guided(url, response_format={"type": "json_object"}) == GuidedDecodingParams(json_object=True)
    assert guided(url, response_format=json_schema()) == GuidedDecodingParams(json=SCHEMA)
    assert guided(url, response_format=json_schema(strict=False, description="a city")) == GuidedDecodingParams(
        json=SCHEMA)
    strict = parse(url, response_format=json_schema(strict=True))
    assert strict.sampling_params.guided_decoding == GuidedDecodingParams(json=SCHEMA, disable_additional_properties=True)
    assert strict.sampling_params.structured_outputs == strict.sampling_params.guided_decoding  # vLLM's name, same
    assert strict.constraint_key == "response_format"


@pytest.mark.parametrize("value, words", [
    ({"type": "json_schema", "json_schema": {"name": "city"}}, ["response_format.json_schema.schema", "missing"]),
    ({"type": "json_schema"}, ["response_format.json_schema", "None"]),
    ({"type": "json_schema", "json_schema": {"name": "city", "schema": [1]}}, ["response_format.json_schema.schema"]),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, ["response_format.json_schema.name"]),
    ({"type": "json_schema", "json_schema": {"name": "a city!", "schema": SCHEMA}}, ["name", "'a city!'"]),
    ({"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA, "strict": "yes"}}, ["strict", "'yes'"]),
    ({"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA, "description": 3}}, ["description"]),
    ({"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA, "extra": 1}}, ["extra", "json_schema"]),
    ({"type": "xml"}, ["response_format.type", "'xml'", "json_schema"]),
    ({}, ["response_format.type", "None"]),
    ({"type": "json_object", "schema": SCHEMA}, ["schema", "response_format"]),
    ("json", ["response_format must be an object"]),
])
@pytest.mark.parametrize("url", [CHAT, COMP])
def test_malformed_response_format(value, words, url):
    fails(*words, url=url, response_format=value)


# ---- vLLM / FastDeploy constraint keys -----------------------------------------------------------
@pytest.mark.parametrize("url", [CHAT, COMP])
def test_guided_keys_mapped(url):
    assert guided(url, guided_json=SCHEMA) == GuidedDecodingParams(json=SCHEMA)
    assert guided(url, guided_json=json.dumps(SCHEMA)) == GuidedDecodingParams(json=SCHEMA)  # JSON text too
    assert guided(url, guided_regex="[0-9]{3}") == GuidedDecodingParams(regex="[0-9]{3}")
    assert guided(url, guided_choice=["yes", "no"]) == GuidedDecodingParams(choice=["yes", "no"])
    assert guided(url, guided_grammar='root ::= "a"') == GuidedDecodingParams(grammar='root ::= "a"')
    assert guided(url, guided_json_object=True) == GuidedDecodingParams(json_object=True)
    assert guided(url, guided_json_object=False) is None  # vLLM's default: no constraint
    tag = json.dumps({"structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}], "triggers": ["<f>"]})
    assert guided(url, structural_tag=tag) == GuidedDecodingParams(structural_tag=tag)
    so = {"regex": "a+", "disable_any_whitespace": True}
    assert guided(url, structured_outputs=so) == GuidedDecodingParams(regex="a+", disable_any_whitespace=True)
    assert guided(url, structured_outputs={"json": json.dumps(SCHEMA)}) == GuidedDecodingParams(json=SCHEMA)
    for key, value in [("guided_regex", "a"), ("structured_outputs", {"choice": ["a"]}), ("structural_tag", tag)]:
        assert parse(url, **{key: value}).constraint_key == key
    r = parse(url, guided_regex="a", guided_decoding_backend="auto")
    assert r.guided_decoding_backend == "auto"  # compared with the LLM's by the worker


@pytest.mark.parametrize("body, words", [
    ({"guided_regex": 5}, ["guided_regex must be a str", "5"]),
    ({"guided_regex": ""}, ["guided_regex must not be an empty string"]),
    ({"guided_choice": []}, ["guided_choice must not be an empty list"]),
    ({"guided_choice": ["a", 1]}, ["guided_choice must be a list of str"]),
    ({"guided_json": "{not json"}, ["guided_json", "not JSON"]),
    ({"guided_json": [1]}, ["guided_json must be a JSON schema"]),
    ({"guided_json_object": "yes"}, ["guided_json_object", "'yes'"]),
    ({"guided_grammar": 1}, ["guided_grammar must be a str"]),
    ({"structural_tag": {"structures": []}}, ["structural_tag must be a str"]),
    ({"structured_outputs": {"regex": "a", "backend": "x"}}, ["'backend'", "structured_outputs", "whitespace_pattern"]),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, ["structured_outputs", "one kind"]),
    ({"structured_outputs": {"regex": 3}}, ["structured_outputs.regex must be a str"]),
    ({"structured_outputs": "regex"}, ["structured_outputs must be an object"]),
    ({"guided_decoding_backend": 3}, ["guided_decoding_backend", "3"]),
    ({"guided_regex": "a", "guided_choice": ["a"]}, ["more than one", "guided_choice", "guided_regex"]),
    ({"response_format": {"type": "json_object"}, "guided_json": SCHEMA}, ["more than one", "response_format",
                                                                            "guided_json"]),
    ({"structured_outputs": {"regex": "a"}, "guided_json_object": True}, ["structured_outputs", "guided_json_object"]),
])
@pytest.mark.parametrize("url", [CHAT, COMP])
def test_malformed_guided_keys(body, words, url):
    fails(*words, url=url, **body)


def test_text_response_format_goes_with_a_guided_key():
    assert guided(response_format={"type": "text"}, guided_regex="a+") == GuidedDecodingParams(regex="a+")


# ---- logits processing ---------------------------------------------------------------------------
@pytest.mark.parametrize("url", [CHAT, COMP])
def test_logits_keys_mapped(url):
    p = parse(url, logit_bias={"17": 100, "4": -100, "9": 2.5}, allowed_token_ids=[4, 17],
              logits_processors_args={"logit_bias": {"3": 1}}).sampling_params
    expected = SamplingParams(logit_bias={17: 100.0, 4: -100.0, 9: 2.5}, allowed_token_ids=[4, 17],
                              logits_processors_args={"logit_bias": {"3": 1}})
    assert (p.logit_bias, p.allowed_token_ids, p.logits_processors_args) == (
        expected.logit_bias, expected.allowed_token_ids, expected.logits_processors_args)


@pytest.mark.parametrize("body, words", [
    ({"logit_bias": {"5": 100.5}}, ["logit_bias value of '5'", "[-100, 100]", "100.5"]),
    ({"logit_bias": {"5": -101}}, ["logit_bias", "-101"]),
    ({"logit_bias": {"five": 1}}, ["logit_bias keys must be token ids", "'five'"]),
    ({"logit_bias": {"-3": 1}}, ["logit_bias keys", "'-3'"]),
    ({"logit_bias": {"5": "x"}}, ["logit_bias value of '5'", "'x'"]),
    ({"logit_bias": [5]}, ["logit_bias must be an object"]),
    ({"allowed_token_ids": []}, ["allowed_token_ids must not be empty"]),
    ({"allowed_token_ids": [1, -2]}, ["allowed_token_ids", "-2"]),
    ({"logits_processors_args": [1]}, ["logits_processors_args must be a dict"]),
])
def test_malformed_logits_keys(body, words):
    fails(*words, url=COMP, **body)


# ---- tools ---------------------------------------------------------------------------------------
def test_tools_and_tool_choice_kept_and_a_named_function_forces_its_schema():
    r = parse(tools=[WEATHER, NOW])
    assert (r.tools, r.tool_choice, r.sampling_params.guided_decoding) == ([WEATHER, NOW], None, None)
    assert parse(tools=[WEATHER], tool_choice="auto").tool_choice == "auto"
    none = parse(tools=[WEATHER], tool_choice="none")
    assert (none.tool_choice, none.sampling_params.guided_decoding, none.constraint_key) == ("none", None, None)
    named = parse(tools=[WEATHER, NOW], tool_choice=NAMED, max_tokens=7, temperature=0)
    assert named.sampling_params.guided_decoding == GuidedDecodingParams(json=SCHEMA)  # the function's parameters
    assert (named.sampling_params.max_tokens, named.sampling_params.temperature) == (7, 0)  # the rest kept
    assert (named.tool_choice, named.constraint_key) == (NAMED, "tool_choice")
    required = parse(tools=[WEATHER, NOW], tool_choice="required")
    assert required.sampling_params.guided_decoding == GuidedDecodingParams(
        json=tool_choice_schema([WEATHER, NOW], "required"))
    assert parse(tool_choice="none").tools is None


@pytest.mark.parametrize("body, words", [
    ({"tools": [{"type": "retrieval"}]}, ["tools[0]", "'retrieval'"]),
    ({"tools": [WEATHER, WEATHER]}, ["tools[1]", "unique"]),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, ["tools[0].function", "name"]),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "fly"}}}, ["'fly'", "get_weather"]),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, ["tool_choice", "'sometimes'"]),
    ({"tool_choice": "required"}, ["tool_choice='required' needs tools"]),
    ({"tools": [WEATHER], "tool_choice": NAMED, "response_format": json_schema()}, ["tool_choice", "response_format",
                                                                                   "one or the other"]),
    ({"tools": [WEATHER], "tool_choice": "required", "guided_regex": "a"}, ["tool_choice", "guided_regex"]),
])
def test_malformed_tools(body, words):
    fails(*words, **body)


def test_tools_are_chat_only():
    fails("tools", url=COMP, code="unknown_parameter", tools=[WEATHER])
    fails("tool_choice", url=COMP, code="unknown_parameter", tool_choice="none")


def test_parser_reads_calls_only_for_chat_with_tools_and_auto():
    assert constraints.parser_reads_calls("chat", [WEATHER], None)
    assert constraints.parser_reads_calls("chat", [WEATHER], "auto")
    assert not constraints.parser_reads_calls("chat", None, None)  # OpenAI: no tools, no calls
    assert not constraints.parser_reads_calls("chat", [WEATHER], "none")
    assert not constraints.parser_reads_calls("chat", [WEATHER], NAMED)  # the forced JSON is read instead
    assert not constraints.parser_reads_calls("completion", None, None)


# ---- the record of a tool call -------------------------------------------------------------------
def record(text, calls, finish_reason="stop"):
    c = CompletionOutput(index=0, token_ids=[1, 2], text=text, tool_calls=calls, finish_reason=finish_reason)
    out = RequestOutput(request_id="7", prompt="p", prompt_token_ids=[1], outputs=CompletionOutputs([c]), finished=True,
                        metrics=RequestMetrics(arrival_time=0.0))
    rec = response_record(parse(tools=[WEATHER]), out, "m")
    return json.loads(json.dumps(rec))["response"]["body"]["choices"][0]


def test_tool_calls_in_the_record_as_openai_shapes_them():
    call = ToolCall.of("get_weather", {"city": "Paris"})
    choice = record("", [call])
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert re.fullmatch(r"call_[0-9a-f]{32}", choice["message"]["tool_calls"][0]["id"])
    said = record("Let me check.", [call])
    assert said["message"]["content"] == "Let me check." and said["finish_reason"] == "tool_calls"
    assert record("", [call], "length")["finish_reason"] == "length"  # only a finished answer says tool_calls
    plain = record("", None)
    assert plain["message"] == {"role": "assistant", "content": ""} and plain["finish_reason"] == "stop"


# ---- nothing but named BatchLineErrors -----------------------------------------------------------
KEYS = ["response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_json_object",
        "structural_tag", "structured_outputs", "guided_decoding_backend", "logit_bias", "allowed_token_ids",
        "logits_processors_args", "tools", "tool_choice"]
VALUES = [None, True, False, 0, -1, 1e300, "", "a", "text", "json_schema", "function", "required", [], [1], ["a"],
          {}, {"type": "json_schema"}, {"type": "function"}, {"5": 200}, {"name": "n"}, {"json": "x"},
          {"type": "json_schema", "json_schema": {"name": "n", "schema": True}}, [{"type": "function"}],
          {"type": "function", "function": {"name": 1}}, [WEATHER], NAMED]


def test_fuzz_output_keys_only_named_batch_line_errors():
    rng = random.Random(27)
    for _ in range(1500):
        body = {key: rng.choice(VALUES) for key in rng.sample(KEYS, rng.randint(1, 3))}
        try:
            r = parse(rng.choice([CHAT, COMP]), **body)
        except BatchLineError as e:
            assert e.code in ("invalid_parameter", "unknown_parameter"), e
            assert not re.match(r"[A-Z]\w+: ", e.message), e.message  # not the safety net: a check named it
            assert any(key in e.message for key in body), (body, e.message)
        else:
            assert isinstance(r.sampling_params, SamplingParams)
