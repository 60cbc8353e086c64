"""parse_request_line: the OpenAI batch input line (OpenAI Batch API docs, vLLM run_batch extras).

Oracles: the documented rules of fastdeploy/entrypoints/batch/format.py, SamplingParams' own
checks (whose messages must reach the error), and a deterministic fuzz: whatever the text, only
BatchLineError comes out."""
import json
import random
import re

import pytest

from fastdeploy import SamplingParams
from fastdeploy.entrypoints.batch.format import BatchLineError, BatchRequest, parse_request_line

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSGS = [{"role": "user", "content": "Hi"}]


def line(body, url=CHAT, custom_id="r1", **top):
    return json.dumps({"custom_id": custom_id, "url": url, "body": body, **top})


def chat(**body):
    return parse_request_line(line({"messages": MSGS, **body}), 7)


def comp(**body):
    return parse_request_line(line({"prompt": "Once", **body}, url=COMP), 7)


def fails(text, code, *words, line_no=3, custom_id="r1"):
    with pytest.raises(BatchLineError) as info:
        parse_request_line(text, line_no)
    e = info.value
    assert (e.code, e.line, e.custom_id) == (code, line_no, custom_id), e
    for w in words:
        assert w in e.message, (w, e.message)
    assert e.message in str(e)
    return e


# ---- the line ------------------------------------------------------------------------------------
def test_chat_line():
    r = parse_request_line(line({"messages": MSGS, "model": "m", "max_tokens": 5}, method="post"), 4)
    assert isinstance(r, BatchRequest)
    assert (r.custom_id, r.line, r.kind, r.messages, r.prompt, r.model) == ("r1", 4, "chat", MSGS, None, "m")
    assert isinstance(r.sampling_params, SamplingParams) and r.sampling_params.max_tokens == 5
    assert r.chat_template_kwargs is None


def test_completion_line_text_and_ids():
    r = parse_request_line(line({"prompt": "Once upon"}, url=COMP), 1)  # method left out: POST
    assert (r.kind, r.prompt, r.messages, r.model) == ("completion", "Once upon", None, None)
    assert parse_request_line(line({"prompt": [1, 2, 3]}, url=COMP), 1).prompt == [1, 2, 3]
    assert parse_request_line(line({"prompt": ["one"]}, url=COMP), 1).prompt == "one"  # one prompt, unwrapped
    assert parse_request_line(line({"prompt": [[4, 5]]}, url=COMP), 1).prompt == [4, 5]


@pytest.mark.parametrize("text, code, words", [
    ("{not json", "invalid_json", ["not valid JSON"]),
    ("", "invalid_json", ["empty"]),
    ('{"custom_id": "r1", "x": NaN}', "invalid_json", ["NaN"]),
    ("[1, 2]", "invalid_request", ["JSON object", "array"]),
    ('"text"', "invalid_request", ["JSON object"]),
    ('{"url": "/v1/completions", "body": {"prompt": "a"}}', "invalid_request", ["custom_id"]),
    ('{"custom_id": "", "url": "/v1/completions", "body": {"prompt": "a"}}', "invalid_request", ["custom_id"]),
    ('{"custom_id": 5, "url": "/v1/completions", "body": {"prompt": "a"}}', "invalid_request", ["custom_id", "5"]),
])
def test_bad_lines_without_custom_id(text, code, words):
    fails(text, code, *words, custom_id=None)


def test_bad_url_method_body_and_top_level_keys():
    fails(line({"query": "a"}, url="/v1/rerank"), "unsupported_url", "/v1/rerank", CHAT, COMP, "/v1/embeddings",
          "/v1/score")
    fails(line({"prompt": "a"}, url="/v1/embeddings"), "unknown_parameter", "prompt", "input")
    fails(json.dumps({"custom_id": "r1", "body": {"prompt": "a"}}), "unsupported_url", "None")
    fails(line({"prompt": "a"}, url=COMP, method="GET"), "unsupported_method", "GET")
    fails(line([1], url=COMP), "invalid_request", "body", "array")
    fails(json.dumps({"custom_id": "r1", "url": COMP}), "invalid_request", "body")
    fails(line({"prompt": "a"}, url=COMP, extra=1), "invalid_request", "extra", "custom_id")


# ---- chat body -----------------------------------------------------------------------------------
def test_messages_validated_naming_the_message():
    fails(line({"messages": []}), "invalid_request", "messages")
    fails(line({}), "invalid_request", "messages")
    e = fails(line({"messages": MSGS + [{"role": "robot", "content": "x"}]}), "invalid_request", "message 1", "robot")
    assert "conversation" not in e.message
    fails(line({"messages": [{"role": "user", "content": 3}]}), "invalid_request", "message 0", "content")
    fails(line({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), "invalid_request", "image_url")
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert parse_request_line(line({"messages": parts}), 1).messages == parts


def test_chat_template_kwargs():
    assert chat(chat_template_kwargs={"enable_thinking": False}).chat_template_kwargs == {"enable_thinking": False}
    fails(line({"messages": MSGS, "chat_template_kwargs": [1]}), "invalid_parameter", "chat_template_kwargs")
    fails(line({"prompt": "a", "chat_template_kwargs": {}}, url=COMP), "unknown_parameter", "chat_template_kwargs")


# ---- completion body -----------------------------------------------------------------------------
def test_prompt_forms_rejected():
    fails(line({"prompt": ["a", "b"]}, url=COMP), "invalid_request", "only one prompt per request")
    fails(line({"prompt": [[1], [2]]}, url=COMP), "invalid_request", "only one prompt per request")
    for bad in ("", [], [1, "a"], [1, -2], [True], 5, {"p": 1}):
        fails(line({"prompt": bad}, url=COMP), "invalid_request", "prompt")
    fails(line({"max_tokens": 3}, url=COMP), "invalid_request", "prompt")
    fails(line({"prompt": "a", "messages": MSGS}, url=COMP), "unknown_parameter", "messages")


# ---- sampling fields -----------------------------------------------------------------------------
def test_sampling_fields_mapped():
    extras = dict(max_tokens=9, temperature=0.5, top_p=0.9, n=2, stop=["x", "y"], seed=3, presence_penalty=0.1,
                  frequency_penalty=-0.2, top_k=5, min_p=0.05, repetition_penalty=1.1, min_tokens=2, ignore_eos=True,
                  stop_token_ids=[7], skip_special_tokens=False, include_stop_str_in_output=True, bad_words=["bad"])
    for r in (chat(**extras), comp(**extras)):
        p = r.sampling_params
        for key, value in extras.items():
            assert getattr(p, key) == value, key
    assert comp(stop="s").sampling_params.stop_strings == ["s"]
    p = comp().sampling_params  # nothing given: SamplingParams' defaults
    assert (p.max_tokens, p.temperature, p.n, p.logprobs) == (None, None, 1, None)


def test_null_values_count_as_absent():
    p = chat(stop=None, min_p=None, logprobs=None, top_logprobs=None, stream=None).sampling_params
    assert (p.stop, p.min_p, p.logprobs) == (None, 0.0, None)


def test_max_completion_tokens():
    assert chat(max_completion_tokens=4).sampling_params.max_tokens == 4
    assert chat(max_completion_tokens=4, max_tokens=4).sampling_params.max_tokens == 4
    fails(line({"messages": MSGS, "max_completion_tokens": 4, "max_tokens": 5}), "invalid_parameter",
          "max_tokens=5", "max_completion_tokens=4")
    fails(line({"messages": MSGS, "max_completion_tokens": 0}), "invalid_parameter", "max_completion_tokens")
    fails(line({"prompt": "a", "max_completion_tokens": 4}, url=COMP), "unknown_parameter", "max_completion_tokens")


def test_chat_logprobs():
    assert chat(logprobs=True).sampling_params.logprobs == 0
    assert chat(logprobs=True, top_logprobs=3).sampling_params.logprobs == 3
    assert chat(logprobs=False).sampling_params.logprobs is None
    fails(line({"messages": MSGS, "top_logprobs": 2}), "invalid_parameter", "top_logprobs", "logprobs=true")
    fails(line({"messages": MSGS, "logprobs": False, "top_logprobs": 2}), "invalid_parameter", "top_logprobs")
    fails(line({"messages": MSGS, "logprobs": 2}), "invalid_parameter", "logprobs", "true or false")
    fails(line({"messages": MSGS, "logprobs": True, "top_logprobs": -1}), "invalid_parameter", "top_logprobs")


def test_completion_logprobs():
    assert comp(logprobs=2).sampling_params.logprobs == 2
    assert comp(logprobs=0).sampling_params.logprobs == 0
    for bad in (True, -1, 1.5, "2"):
        fails(line({"prompt": "a", "logprobs": bad}, url=COMP), "invalid_parameter", "logprobs")
    fails(line({"prompt": "a", "top_logprobs": 2}, url=COMP), "unknown_parameter", "top_logprobs")


@pytest.mark.parametrize("key, value", [("temperature", -1), ("top_p", 0), ("n", 0), ("max_tokens", 0),
                                        ("seed", -5), ("stop", [1]), ("top_k", -3), ("min_tokens", "2"),
                                        ("presence_penalty", 3), ("ignore_eos", "yes"), ("bad_words", [""])])
def test_sampling_params_errors_carry_its_message(key, value):
    with pytest.raises((ValueError, TypeError)) as expected:
        SamplingParams(**{key: value})
    e = fails(line({"prompt": "a", key: value}, url=COMP), "invalid_parameter", key)
    assert e.message == str(expected.value)


def test_ignored_keys_and_stream():
    r = chat(model="my-model", user="u", stream=False, stream_options={"include_usage": True})
    assert r.model == "my-model"
    fails(line({"messages": MSGS, "stream": True}), "invalid_parameter", "stream is not supported in batch")
    fails(line({"messages": MSGS, "model": 3}), "invalid_parameter", "model")


def test_unknown_keys_named_with_accepted_list():
    e = fails(line({"messages": MSGS, "echo": True, "best_of": 2}), "unknown_parameter", "echo", "best_of")
    for accepted in ("max_completion_tokens", "top_logprobs", "temperature", "chat_template_kwargs", "stream",
                     "tools", "logit_bias", "response_format", "guided_json"):
        assert accepted in e.message.split("accepted:")[1]


# ---- nothing but BatchLineError ------------------------------------------------------------------
ATOMS = ['"custom_id"', '"url"', '"body"', '"method"', '"messages"', '"prompt"', f'"{CHAT}"', f'"{COMP}"',
         '"role"', '"content"', '"user"', '"max_tokens"', '"logprobs"', '"top_logprobs"', '"stop"', '"n"',
         '"temperature"', '"seed"', '"text"', '"type"', '"POST"', "0", "-1", "1e400", "3.5", "true", "false",
         "null", "NaN", "[]", "{}", '""', "99999999999999999999999", '"\\ud800"']


def _value(rng, depth):
    roll = rng.random()
    if depth > 3 or roll < 0.45:
        return rng.choice(ATOMS)
    items = [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if roll < 0.7:
        return "[" + ", ".join(items) + "]"
    keys = [rng.choice(ATOMS[:20]) for _ in items]
    return "{" + ", ".join(f"{k}: {v}" for k, v in zip(keys, items)) + "}"


def _mutate(rng, text):
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(chars) + 1)
        chars.insert(i, rng.choice('{}[]",:\\ x\x00é\ufeff'))
    return "".join(chars)


def test_fuzz_only_batch_line_errors():
    rng = random.Random(16)
    good = line({"messages": MSGS, "max_tokens": 3, "logprobs": True, "top_logprobs": 1})
    texts = ["[" * 100000, "{" * 5000, '{"custom_id": "a", "body": ' + "[" * 50000, b"\xff\xfe", None, 5,
             "\ufeff" + good]
    for _ in range(1500):
        kind = rng.random()
        if kind < 0.2:
            key = rng.choice(ATOMS[9:20])
            texts.append(line({"messages": MSGS}, url=rng.choice([CHAT, COMP]))[:-2] + f", {key}: {_value(rng, 2)}}}}}")
        elif kind < 0.4:
            body = _value(rng, 1)
            texts.append(f'{{"custom_id": "c", "url": {rng.choice(ATOMS[6:8])}, "body": {body}}}')
        elif kind < 0.7:
            texts.append(_value(rng, 0))
        else:
            texts.append(_mutate(rng, good))
    parsed, codes = 0, set()
    for i, text in enumerate(texts):
        try:
            r = parse_request_line(text, i + 1)
        except BatchLineError as e:
            assert e.line == i + 1 and isinstance(e.code, str) and isinstance(e.message, str)
            assert e.custom_id is None or isinstance(e.custom_id, str)
            assert not re.match(r"[A-Z]\w+: ", e.message), e.message  # not the safety net: a check named it
            codes.add(e.code)
        else:
            parsed += 1
            assert r.kind in ("chat", "completion") and isinstance(r.sampling_params, SamplingParams)
    assert {"invalid_json", "invalid_request", "unknown_parameter", "invalid_parameter"} <= codes
    assert parsed >= 2  # the BOM-prefixed good line and some mutations parse


def test_docs_list_every_key_and_code():
    from pathlib import Path

    from fastdeploy.entrypoints.batch import format as fmt

    doc = (Path(__file__).resolve().parents[3] / "docs" / "batch_format.md").read_text()
    for key in set(fmt.CHAT_KEYS) | set(fmt.COMPLETION_KEYS) | set(fmt.LINE_KEYS):
        assert f"`{key}`" in doc, key
    for code in (fmt.INVALID_JSON, fmt.INVALID_REQUEST, fmt.UNSUPPORTED_METHOD, fmt.UNSUPPORTED_URL,
                 fmt.UNKNOWN_PARAMETER, fmt.INVALID_PARAMETER, fmt.INTERNAL_ERROR):
        assert f"`{code}`" in doc, code
