"""parse_chat_request / parse_completion_request: the server's request bodies (OpenAI's API reference,
vLLM's extra keys), and OpenAIError's body.

Oracles: the documented rules of fastdeploy/entrypoints/openai/protocol.py, SamplingParams' own
checks (whose messages must reach the 400), the official `openai` client's ErrorObject model, and
a sweep of wrong types over every accepted key: whatever the value, only OpenAIError (400) comes
out, naming the key."""
import pytest
from openai.types.shared import ErrorObject

from fastdeploy import SamplingParams
from fastdeploy.entrypoints.openai.protocol import (
    CHAT_KEYS,
    COMPLETION_KEYS,
    SERVER_KEYS,
    OpenAIError,
    parse_chat_request,
    parse_completion_request,
)

NAMES = ["served", "alias"]
MSGS = [{"role": "user", "content": "Hi"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}


def chat(**body):
    return parse_chat_request({"model": "served", "messages": MSGS, **body}, NAMES)


def comp(**body):
    return parse_completion_request({"model": "served", "prompt": "Once", **body}, NAMES)


def fails(parse, body, status, param, *words, code=None):
    with pytest.raises(OpenAIError) as info:
        parse(body, NAMES)
    e = info.value
    assert (e.status_code, e.param) == (status, param), (e.status_code, e.param, e.message)
    for w in words:
        assert w in e.message, (w, e.message)
    if code is not None:
        assert e.code == code
    ErrorObject.model_validate(e.body()["error"])  # the client's own error model
    assert e.body()["error"]["message"] == e.message
    return e


def test_chat_request_fields():
    r = chat(temperature=0.5, max_completion_tokens=7, logprobs=True, top_logprobs=3, user="u",
             chat_template_kwargs={"enable_thinking": False})
    assert (r.kind, r.messages, r.prompts, r.model) == ("chat", MSGS, None, "served")
    p = r.sampling_params
    assert isinstance(p, SamplingParams) and (p.temperature, p.max_tokens, p.logprobs) == (0.5, 7, 3)
    assert r.chat_template_kwargs == {"enable_thinking": False}
    assert (r.stream, r.include_usage, r.continuous_usage_stats) == (False, False, False)


def test_model_absent_is_the_first_served_name_and_unknown_is_404():
    assert parse_chat_request({"messages": MSGS}, NAMES).model == "served"
    assert parse_chat_request({"messages": MSGS, "model": "alias"}, NAMES).model == "alias"
    e = fails(parse_chat_request, {"messages": MSGS, "model": "gpt-4o"}, 404, "model", "gpt-4o", "served",
              code="model_not_found")
    assert e.body()["error"]["type"] == "invalid_request_error"
    fails(parse_completion_request, {"prompt": "a", "model": "nope"}, 404, "model", code="model_not_found")
    fails(parse_chat_request, {"messages": MSGS, "model": 3}, 400, "model", "model must be a string")


def test_stream_and_stream_options():
    r = chat(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert (r.stream, r.include_usage, r.continuous_usage_stats) == (True, True, True)
    r = comp(stream=True, stream_options={"include_usage": False})
    assert (r.stream, r.include_usage, r.continuous_usage_stats) == (True, False, False)
    assert chat(stream=True, stream_options=None).include_usage is False
    body = {"messages": MSGS, "stream_options": {"include_usage": True}}
    fails(parse_chat_request, body, 400, "stream_options", "stream=true")
    fails(parse_chat_request, {**body, "stream": False}, 400, "stream_options", "stream=true")
    fails(parse_completion_request, {"prompt": "a", "stream_options": {}}, 400, "stream_options", "stream=true")
    fails(parse_chat_request, {"messages": MSGS, "stream": "yes"}, 400, "stream", "true or false")
    fails(parse_chat_request, {"messages": MSGS, "stream": True, "stream_options": [1]}, 400, "stream_options")
    fails(parse_chat_request, {"messages": MSGS, "stream": True, "stream_options": {"include_usage": 1}}, 400,
          "stream_options", "include_usage")
    fails(parse_chat_request, {"messages": MSGS, "stream": True, "stream_options": {"usage": True}}, 400,
          "stream_options", "usage", "continuous_usage_stats", code="unknown_parameter")


def test_unknown_keys_are_named():
    e = fails(parse_chat_request, {"messages": MSGS, "best_of": 2, "suffix": "x"}, 400, "best_of",
              "best_of", "suffix", code="unknown_parameter")
    assert "stream_options" in e.message.split("accepted:")[1]
    fails(parse_completion_request, {"prompt": "a", "messages": MSGS}, 400, "messages", code="unknown_parameter")
    fails(parse_completion_request, {"prompt": "a", "tools": [WEATHER]}, 400, "tools", code="unknown_parameter")
    fails(parse_completion_request, {"prompt": "a", "max_completion_tokens": 3}, 400, "max_completion_tokens")


def test_echo_only_false():
    assert comp(echo=False).prompts == ["Once"]
    fails(parse_completion_request, {"prompt": "a", "echo": True}, 400, "echo", "not supported")
    fails(parse_chat_request, {"messages": MSGS, "echo": 1}, 400, "echo")


def test_prompt_logprobs():
    assert comp(prompt_logprobs=2).sampling_params.prompt_logprobs == 2
    assert chat(prompt_logprobs=0).sampling_params.prompt_logprobs == 0
    with pytest.raises((ValueError, TypeError)) as expected:
        SamplingParams(prompt_logprobs="2")
    e = fails(parse_completion_request, {"prompt": "a", "prompt_logprobs": "2"}, 400, "prompt_logprobs")
    assert e.message == str(expected.value)


def test_completion_prompts():
    assert comp().prompts == ["Once"]
    assert comp(prompt=[1, 2, 3]).prompts == [[1, 2, 3]]
    assert comp(prompt=["a", "b"]).prompts == ["a", "b"]
    assert comp(prompt=[[1], [2, 3]]).prompts == [[1], [2, 3]]
    assert comp(prompt=["a", [4]]).prompts == ["a", [4]]
    for bad in ("", [], [""], [[]], [1, "a"], [1, -2], [True], [[1, -1]], 5, {"p": 1}):
        fails(parse_completion_request, {"prompt": bad}, 400, "prompt", "prompt", code="invalid_request")
    fails(parse_completion_request, {"max_tokens": 3}, 400, "prompt", code="invalid_request")


def test_messages_and_body_shape():
    fails(parse_chat_request, {"messages": []}, 400, "messages", code="invalid_request")
    fails(parse_chat_request, {}, 400, "messages")
    fails(parse_chat_request, {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages", "robot")
    fails(parse_chat_request, [1], 400, None, "body", "array", code="invalid_request")
    fails(parse_chat_request, "text", 400, None, "body")


@pytest.mark.parametrize("key, value", [("temperature", -1), ("top_p", 0), ("n", 0), ("max_tokens", 0),
                                        ("seed", -5), ("stop", [1]), ("top_k", -3), ("min_tokens", "2"),
                                        ("presence_penalty", 3), ("ignore_eos", "yes"), ("min_p", 2)])
def test_sampling_params_errors_are_400_with_its_message(key, value):
    with pytest.raises((ValueError, TypeError)) as expected:
        SamplingParams(**{key: value})
    e = fails(parse_completion_request, {"prompt": "a", key: value}, 400, key, code="invalid_parameter")
    assert e.message == str(expected.value)


def test_logprobs_rules():
    assert chat(logprobs=True).sampling_params.logprobs == 0
    assert chat(logprobs=False, top_logprobs=None).sampling_params.logprobs is None
    fails(parse_chat_request, {"messages": MSGS, "top_logprobs": 2}, 400, "top_logprobs", "logprobs=true")
    fails(parse_chat_request, {"messages": MSGS, "logprobs": 2}, 400, "logprobs", "true or false")
    assert comp(logprobs=3).sampling_params.logprobs == 3
    fails(parse_completion_request, {"prompt": "a", "logprobs": True}, 400, "logprobs", "int >= 0")


def test_output_keys_and_tools():
    r = chat(tools=[WEATHER], tool_choice="required")
    assert r.tool_choice == "required" and r.constraint_key == "tool_choice"
    assert r.sampling_params.guided_decoding is not None and r.tools[0]["function"]["name"] == "get_weather"
    r = comp(response_format={"type": "json_object"})
    assert r.constraint_key == "response_format" and r.sampling_params.guided_decoding.json_object
    fails(parse_chat_request, {"messages": MSGS, "tool_choice": "required"}, 400, "tool_choice", "tool_choice")
    fails(parse_chat_request, {"messages": MSGS, "tools": [{"type": "x"}]}, 400, "tools", "tools")
    fails(parse_completion_request, {"prompt": "a", "response_format": {"type": "xml"}}, 400, "response_format",
          "response_format.type")
    fails(parse_completion_request, {"prompt": "a", "logit_bias": {"5": 300}}, 400, "logit_bias", "[-100, 100]")


WRONG_VALUES = ["x", 3, -1, 2.5, True, [1], ["a"], {"a": 1}, {}, [], 10 ** 30]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_any_wrong_type_is_400_naming_the_key(kind):
    parse = parse_chat_request if kind == "chat" else parse_completion_request
    base = {"messages": MSGS} if kind == "chat" else {"prompt": "a"}
    keys = (*(CHAT_KEYS if kind == "chat" else COMPLETION_KEYS), *SERVER_KEYS)
    failures = 0
    for key in keys:
        for value in WRONG_VALUES:
            try:
                parse({**base, key: value}, NAMES)
            except OpenAIError as e:
                failures += 1
                assert e.status_code in (400, 404), (key, value, e.message)
                assert key in e.message, (key, value, e.message)
                assert not e.message.startswith(("TypeError", "ValueError", "KeyError")), (key, value, e.message)
    assert failures > len(keys) * 3  # most of these are wrong for most keys


def test_run_batch_parses_a_body_as_the_server_does():
    import json

    from fastdeploy.entrypoints.batch.format import parse_request_line

    body = {"messages": MSGS, "temperature": 0.3, "top_k": 5, "stop": ["x"], "max_completion_tokens": 9,
            "logprobs": True, "top_logprobs": 2, "tools": [WEATHER], "tool_choice": "required", "model": "served"}
    server = parse_chat_request(body, NAMES)
    batch = parse_request_line(json.dumps({"custom_id": "a", "url": "/v1/chat/completions", "body": body}), 1)
    assert batch.sampling_params == server.sampling_params
    assert (batch.messages, batch.tools, batch.tool_choice, batch.constraint_key) == \
        (server.messages, server.tools, server.tool_choice, server.constraint_key)
