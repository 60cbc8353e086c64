"""run-batch end to end on the default model with the output-control keys: json_schema, regex and
choice lines whose answers validate (jsonschema) / fullmatch / are a choice, a named tool_choice
whose record holds a call with valid arguments, logit_bias and allowed_token_ids reaching the
sampler, and the lines the LLM refuses (a backend other than its own, tool_choice "auto" without a
parser, a regex that does not compile) as error records while the rest run.

Oracles: the schemas themselves (jsonschema), Python's `re`, the choice list, the tokenizer's own
token texts, and the documented error rules."""
import json
import re
import subprocess

import jsonschema
from test_run_batch import REPO, command, read_records, write_jsonl
from test_tool_calls import QWEN_STYLE

from fastdeploy.entrypoints.chat_utils import render_conversation

CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                         "population": {"type": "integer", "minimum": 0, "maximum": 99999999}},
        "required": ["name", "population"]}
STRICT_CITY = {**CITY, "additionalProperties": False}  # what `strict: true` promises
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 24},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                "required": ["city", "unit"], "additionalProperties": False}}}
PHONE = "[0-9]{3}-[0-9]{4}"
ASK_CITY = [{"role": "user", "content": "Describe Paris as JSON with its name and population."}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def chat_line(custom_id, **body):
    return {"custom_id": custom_id, "url": "/v1/chat/completions",
            "body": {"messages": ASK_CITY, "temperature": 0, "max_tokens": 60, **body}}


def completion_line(custom_id, **body):
    return {"custom_id": custom_id, "url": "/v1/completions",
            "body": {"prompt": "The city record: ", "temperature": 0, "max_tokens": 60, **body}}


def test_structured_outputs_tools_and_logit_bias_through_run_batch(tmp_path, tok):
    city_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    biased = tok.encode(" blue", add_special_tokens=False)[0]
    allowed = [tok.encode(w, add_special_tokens=False)[0] for w in (" yes", " no")]
    rows = [
        chat_line("schema-chat", response_format=city_format),
        completion_line("schema-completion", response_format=city_format),
        completion_line("regex", prompt="Call me at ", max_tokens=16, guided_regex=PHONE),
        chat_line("choice", messages=[{"role": "user", "content": "Is Paris in France?"}],
                  guided_choice=["yes", "no", "maybe"]),
        chat_line("tool", messages=ASK_WEATHER, tools=[WEATHER],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        completion_line("bias", max_tokens=3, logprobs=0, logit_bias={str(biased): 100}),
        completion_line("allowed", max_tokens=4, logprobs=0, allowed_token_ids=allowed),
        chat_line("backend", guided_regex="a+", guided_decoding_backend="xgrammar"),
        chat_line("auto", messages=ASK_WEATHER, tools=[WEATHER], tool_choice="auto"),
        completion_line("bad-regex", guided_regex="([a-z"),
        chat_line("no-schema", response_format={"type": "json_schema", "json_schema": {"name": "city"}}),
        chat_line("plain", max_tokens=5),
    ]
    inp, out, template = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "qwen_style.jinja"
    write_jsonl(inp, rows)
    template.write_text(QWEN_STYLE, encoding="utf-8")
    done = subprocess.run(command(inp, out, "--chat-template", str(template)), cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    records = {r["custom_id"]: r for r in read_records(out)}
    assert sorted(records) == sorted(r["custom_id"] for r in rows)

    def choice(custom_id):
        record = records[custom_id]
        assert record["error"] is None, record["error"]
        return record["response"]["body"]["choices"][0]

    for custom_id in ("schema-chat", "schema-completion"):
        c = choice(custom_id)
        assert c["finish_reason"] == "stop", c
        jsonschema.validate(json.loads(c.get("text", c.get("message", {}).get("content"))), STRICT_CITY)
    assert re.fullmatch(PHONE, choice("regex")["text"])
    assert choice("choice")["message"]["content"] in ("yes", "no", "maybe")

    tool = choice("tool")
    assert tool["finish_reason"] == "tool_calls" and tool["message"]["content"] is None
    (call,) = tool["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert re.fullmatch(r"call_[0-9a-f]{32}", call["id"])
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])
    with_tools = render_conversation(tok, ASK_WEATHER, QWEN_STYLE, None, tools=[WEATHER])  # the tools reached the template
    assert records["tool"]["response"]["body"]["usage"]["prompt_tokens"] == len(tok.encode(with_tools,
                                                                                         add_special_tokens=False))

    assert choice("bias")["logprobs"]["tokens"] == [tok.decode([biased])] * 3
    allowed_texts = {tok.decode([t]) for t in allowed}
    assert set(choice("allowed")["logprobs"]["tokens"]) <= allowed_texts
    assert choice("plain")["message"]["content"]

    def error(custom_id):
        record = records[custom_id]
        assert record["response"] is None and record["error"]["code"] == "invalid_parameter", record
        return record["error"]["message"]

    assert "per-request backends are not supported" in error("backend") and "'auto'" in error("backend")
    assert "tool_choice='auto' needs a tool call parser" in error("auto")
    assert error("bad-regex").startswith("guided_regex: ")
    assert "response_format.json_schema.schema is missing" in error("no-schema")
    assert records["no-schema"]["error"]["line"] == 11
