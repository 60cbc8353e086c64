"""A real API server's shaped outputs: response_format, tools and tool_choice, reasoning_content
(--reasoning-parser qwen3) and chat_template_kwargs (--chat-template), bodies and streams.

The server runs the default model under a chat template of this module that, like Qwen3's, closes
the thinking in the prompt (`<think>\\n\\n</think>\\n\\n`) unless `enable_thinking` is true, and
then opens it (`<think>\\n`): with a reasoning parser a constraint starts only once the thinking
has ended, so the constraints here apply from the first token, and `enable_thinking: true` (a
chat_template_kwargs key) lifts them.

Oracles: jsonschema on the constrained outputs and tool arguments; the regex that forces
`<think>abc</think>def` (the reasoning parser must split it into "abc" and "def"); the template rendered
by transformers' chat-template code and counted by the GGUF tokenizer (usage.prompt_tokens); the
non-streamed answer for each stream (greedy).
"""
import json

import jsonschema
import openai
import pytest

from running_server import RunningServer

TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking %}<think>\n{% else %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
MSGS = [{"role": "user", "content": "Describe a person."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
        "additionalProperties": False}
ZONE = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": CITY}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": ZONE}}]
SCHEMAS = {"get_weather": CITY, "get_time": ZONE}
THOUGHT = {"structured_outputs": {"regex": "<think>abc</think>def"}}  # a thought and an answer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "thinking.jinja"
    template.write_text(TEMPLATE)
    with RunningServer("--max-model-len", "512", "--max-num-seqs", "8", "--reasoning-parser", "qwen3",
                       "--chat-template", str(template)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return server.client(timeout=60)


def chat(client, server, **kwargs):
    kwargs.setdefault("messages", MSGS)
    kwargs.setdefault("max_tokens", 40)
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(model=server.model, **kwargs)


def streamed(client, server, **kwargs):
    """(content, reasoning_content, tool_calls as {index: {id, name, arguments}}, finish_reasons) of a stream."""
    content, reasoning, calls, reasons = "", "", {}, []
    for chunk in chat(client, server, stream=True, **kwargs):
        for c in chunk.choices:
            content += c.delta.content or ""
            reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
            for call in c.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += call.id or ""
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            if c.finish_reason is not None:
                reasons.append(c.finish_reason)
    return content, reasoning, calls, reasons


# ---- response_format -----------------------------------------------------------------------------
def test_json_schema_response_format(client, server):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    body = chat(client, server, response_format=fmt)
    assert body.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(body.choices[0].message.content), PERSON)
    content, _, _, reasons = streamed(client, server, response_format=fmt)
    assert content == body.choices[0].message.content and reasons == ["stop"]


def test_json_object_response_format(client, server):
    body = chat(client, server, response_format={"type": "json_object"}, max_tokens=60)
    assert body.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(body.choices[0].message.content), dict)


def test_bad_response_format_is_400(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, server, response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert "response_format" in e.value.message and e.value.body["param"] == "response_format"


# ---- tools ---------------------------------------------------------------------------------------
def check_calls(calls, names):
    assert calls and len({c.id for c in calls}) == len(calls) and all(c.id for c in calls)
    for call in calls:
        assert call.type == "function" and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_calls(client, server, choice):
    names = set(SCHEMAS) if choice == "required" else {"get_time"}
    body = chat(client, server, tools=TOOLS, tool_choice=choice, max_tokens=60)
    c = body.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    check_calls(c.message.tool_calls, names)
    if choice != "required":
        assert len(c.message.tool_calls) == 1

    content, _, calls, reasons = streamed(client, server, tools=TOOLS, tool_choice=choice, max_tokens=60)
    assert reasons == ["tool_calls"] and content == ""
    assert [(v["name"], json.loads(v["arguments"])) for _, v in sorted(calls.items())] == \
        [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls]
    assert all(v["id"] for v in calls.values())


def test_tool_choice_auto_without_a_parser_is_400(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, server, tools=TOOLS, tool_choice="auto")
    assert "--tool-call-parser" in e.value.message


def test_tool_choice_none_answers_in_text(client, server):
    body = chat(client, server, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert body.choices[0].message.tool_calls is None and body.choices[0].message.content
    assert body.choices[0].finish_reason in ("stop", "length")


# ---- reasoning_content ---------------------------------------------------------------------------
def test_reasoning_content_in_message_and_deltas(client, server):
    body = chat(client, server, max_tokens=16, extra_body=THOUGHT)
    message = body.choices[0].message
    assert message.model_extra["reasoning_content"] == "abc" and message.content == "def"
    assert body.choices[0].finish_reason == "stop"
    content, reasoning, _, reasons = streamed(client, server, max_tokens=16, extra_body=THOUGHT)
    assert (reasoning, content, reasons) == ("abc", "def", ["stop"])


def test_open_thinking_streams_as_reasoning(client, server):
    """enable_thinking leaves `<think>` open in the prompt: the stream sends the text as
    reasoning_content as it is made (stripped, as qwen3 strips a reasoning without `<think>`); the
    body, without a `</think>`, gives it as the answer (FastDeploy's rule; see stream_delta.py)."""
    kwargs = dict(max_tokens=6, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    body = chat(client, server, **kwargs).choices[0].message
    assert body.model_extra.get("reasoning_content") is None and body.content
    content, reasoning, _, reasons = streamed(client, server, **kwargs)
    assert (reasoning, content, reasons) == (body.content.strip(), "", ["length"])


def test_no_reasoning_without_the_end_tag(client, server):
    body = chat(client, server, max_tokens=6)
    message = body.choices[0].message
    assert message.model_extra.get("reasoning_content") is None and message.content
    assert "</think>" not in message.content


# ---- chat_template_kwargs ------------------------------------------------------------------------
def test_chat_template_kwargs_reach_the_template(client, server):
    from fastdeploy.input.gguf_tokenizer import load_gguf_tokenizer
    from fastdeploy.model_executor.model_loader.gguf_file import GGUFFile
    from fastdeploy.model_executor.model_loader.model_path import default_model_path

    tok = load_gguf_tokenizer(GGUFFile(default_model_path()))
    for thinking in (False, True):
        rendered = tok.apply_chat_template(MSGS, chat_template=TEMPLATE, add_generation_prompt=True, tokenize=False,
                                           enable_thinking=thinking)
        body = chat(client, server, max_tokens=16, extra_body={"chat_template_kwargs": {"enable_thinking": thinking},
                                                              **THOUGHT})
        assert body.usage.prompt_tokens == len(tok(rendered, add_special_tokens=False)["input_ids"])
        message = body.choices[0].message
        if thinking:  # the prompt leaves the thinking open: the regex waits for a `</think>` that never comes
            assert message.content != "def" and message.model_extra.get("reasoning_content") is None
        else:
            assert (message.model_extra["reasoning_content"], message.content) == ("abc", "def")
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, server, extra_body={"chat_template_kwargs": ["enable_thinking"]})
    assert e.value.body["param"] == "chat_template_kwargs"
