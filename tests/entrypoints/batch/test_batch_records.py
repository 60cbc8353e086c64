"""response_record / error_record: the OpenAI batch output line (chat.completion and text_completion
bodies, OpenAI's logprobs shapes), from RequestOutputs built by hand and from the default model.

Oracles: the hand-built outputs' own numbers, llm.chat / llm.generate run directly with the same
settings, the tokenizer (prompt length), and JSON itself (every record must dump without NaN/inf)."""
import json
import time

import pytest

from fastdeploy import SamplingParams
from fastdeploy.engine.request import CompletionOutput, CompletionOutputs, Logprob, RequestMetrics, RequestOutput
from fastdeploy.entrypoints.batch.format import error_record, parse_request_line, response_record

MSGS = [{"role": "user", "content": "Name a fruit."}]


def request(url="/v1/chat/completions", **body):
    body = {"messages": MSGS, **body} if url.endswith("chat/completions") else {"prompt": "Once", **body}
    return parse_request_line(json.dumps({"custom_id": "q-7", "url": url, "body": body}), 12)


def output(*completions, error_code=200, error_msg=None):
    return RequestOutput(request_id="engine-42", prompt="p", prompt_token_ids=[1, 2, 3, 4],
                         outputs=CompletionOutputs(completions), finished=True,
                         metrics=RequestMetrics(arrival_time=0.0), error_code=error_code, error_msg=error_msg)


# token 10 is the top token; token 11 is outside the top 2 (so its dict has 3 entries)
LOGPROBS = [{10: Logprob(-0.1, 1, "He"), 12: Logprob(-2.5, 2, "Hi")},
            {11: Logprob(-3.0, 4, "llo"), 13: Logprob(-0.5, 1, "y"), 14: Logprob(-1.0, 2, "é")}]


def completion(**kw):
    values = dict(index=0, token_ids=[10, 11], text="Hello", finish_reason="stop", logprobs=None)
    return CompletionOutput(**{**values, **kw})


def roundtrip(record):
    return json.loads(json.dumps(record, allow_nan=False))


def test_chat_record_shape():
    before = int(time.time())
    rec = roundtrip(response_record(request(model="asked"), output(completion()), "served"))
    assert rec["id"].startswith("batch_req_") and len(rec["id"]) == len("batch_req_") + 32
    assert (rec["custom_id"], rec["error"]) == ("q-7", None)
    resp = rec["response"]
    assert (resp["status_code"], resp["request_id"]) == (200, "engine-42")
    body = resp["body"]
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert before <= body["created"] <= time.time() and isinstance(body["created"], int)
    assert body["model"] == "asked"  # the line's model is echoed
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                                "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


def test_model_name_when_the_line_names_none_and_ids_unique():
    r = request()
    a, b = (response_record(r, output(completion()), "served") for _ in range(2))
    assert a["response"]["body"]["model"] == "served"
    assert a["id"] != b["id"] and a["response"]["body"]["id"] != b["response"]["body"]["id"]


def test_n_choices_reasoning_and_finish_reasons():
    outs = output(completion(index=0, token_ids=[5], text="a", reasoning_content="think", finish_reason="length"),
                  completion(index=1, token_ids=[6, 7, 8], text="bcd", finish_reason="abort"))
    body = response_record(request(n=2, temperature=1.0), outs, "m")["response"]["body"]
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "a", "reasoning_content": "think"}
    assert "reasoning_content" not in body["choices"][1]["message"]
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "abort"]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}


def test_chat_logprobs_openai_shape():
    r = request(logprobs=True, top_logprobs=2)
    choice = roundtrip(response_record(r, output(completion(logprobs=LOGPROBS)), "m"))["response"]["body"]["choices"][0]
    first, second = choice["logprobs"]["content"]
    assert first == {"token": "He", "logprob": -0.1, "bytes": [72, 101], "top_logprobs": [
        {"token": "He", "logprob": -0.1, "bytes": [72, 101]}, {"token": "Hi", "logprob": -2.5, "bytes": [72, 105]}]}
    assert (second["token"], second["logprob"], second["bytes"]) == ("llo", -3.0, list(b"llo"))
    # the top 2 only: the generated token (rank 4) is not one of them
    assert second["top_logprobs"] == [{"token": "y", "logprob": -0.5, "bytes": [121]},
                                      {"token": "é", "logprob": -1.0, "bytes": [195, 169]}]


def test_chat_logprobs_without_top_logprobs_and_unrepresentable_values():
    lps = [{10: Logprob(float("-inf"), 1, None)}, {11: Logprob(-0.2, 1, "x")}]
    rec = roundtrip(response_record(request(logprobs=True), output(completion(logprobs=lps)), "m"))
    content = rec["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert [e["top_logprobs"] for e in content] == [[], []]  # top_logprobs 0: none listed
    assert content[0]["logprob"] == -9999.0 and content[0]["token"] == "token_id:10"


def test_completion_record_and_logprobs():
    r = request("/v1/completions", logprobs=2)
    rec = roundtrip(response_record(r, output(completion(logprobs=LOGPROBS, finish_reason="length")), "m"))
    body = rec["response"]["body"]
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert (choice["index"], choice["text"], choice["finish_reason"]) == (0, "Hello", "length")
    assert "message" not in choice
    assert choice["logprobs"] == {
        "tokens": ["He", "llo"], "token_logprobs": [-0.1, -3.0], "text_offset": [0, 2],
        # OpenAI: the k most likely and the sampled token (k + 1 entries when it is not among them)
        "top_logprobs": [{"He": -0.1, "Hi": -2.5}, {"y": -0.5, "é": -1.0, "llo": -3.0}]}
    assert list(choice["logprobs"]["top_logprobs"][1]) == ["y", "é", "llo"]  # by rank
    assert body["usage"]["completion_tokens"] == 2
    assert response_record(r, output(completion()), "m")["response"]["body"]["choices"][0]["logprobs"] is None


def test_failed_output_becomes_an_internal_error_record():
    rec = response_record(request(), output(completion(finish_reason="abort"), error_code=500, error_msg="boom"), "m")
    assert rec["response"] is None and rec["custom_id"] == "q-7" and rec["id"].startswith("batch_req_")
    assert rec["error"] == {"code": "internal_error", "message": "boom", "line": 12, "status_code": 500}
    assert response_record(request(), output(completion(), error_code=500), "m")["error"]["message"]


def test_error_record():
    rec = roundtrip(error_record(None, 5, "invalid_json", "not valid JSON"))
    assert rec["id"].startswith("batch_req_") and rec["custom_id"] is None and rec["response"] is None
    assert rec["error"] == {"code": "invalid_json", "message": "not valid JSON", "line": 5, "status_code": 400}
    assert error_record("a", 1, "x", "y", 503)["error"]["status_code"] == 503


# ---- end to end on the default model -----------------------------------------------------------------
def test_chat_record_from_the_default_model(smollm_llm, tok):
    r = request(temperature=0, max_completion_tokens=12, logprobs=True, top_logprobs=2, model=None)
    out = smollm_llm.chat(r.messages, r.sampling_params, use_tqdm=False, chat_template_kwargs=r.chat_template_kwargs)[0]
    plain = smollm_llm.chat(MSGS, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0].outputs
    rec = roundtrip(response_record(r, out, "SmolLM2"))
    body = rec["response"]["body"]
    assert body["model"] == "SmolLM2" and rec["response"]["request_id"] == out.request_id
    (choice,) = body["choices"]
    c = out.outputs[0]
    assert choice["message"]["content"] == plain.text == c.text and choice["finish_reason"] == plain.finish_reason
    entries = choice["logprobs"]["content"]
    assert len(entries) == len(c.token_ids) == len(c.logprobs)
    for entry, d, t in zip(entries, c.logprobs, c.token_ids):
        assert entry["token"] == d[t].decoded_token == tok.decode([t])
        assert entry["logprob"] == pytest.approx(d[t].logprob) and entry["bytes"] == list(entry["token"].encode())
        top = entry["top_logprobs"]
        assert len(top) == 2 and top[0]["logprob"] >= top[1]["logprob"]
        assert top[0]["token"] == entry["token"]  # greedy: the generated token is the most likely
        by_rank = sorted(d.values(), key=lambda lp: lp.rank)[:2]
        assert [e["logprob"] for e in top] == pytest.approx([lp.logprob for lp in by_rank])
    prompt_ids = tok.encode(out.prompt, add_special_tokens=False)
    assert body["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": len(c.token_ids),
                             "total_tokens": len(prompt_ids) + len(c.token_ids)}


def test_completion_record_from_the_default_model(smollm_llm, tok):
    r = request("/v1/completions", prompt="Once upon a time", temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    out = smollm_llm.generate(r.prompt, r.sampling_params, use_tqdm=False)[0]
    rec = roundtrip(response_record(r, out, "SmolLM2"))
    (choice,) = rec["response"]["body"]["choices"]
    c = out.outputs[0]
    lp = choice["logprobs"]
    assert choice["text"] == c.text and choice["finish_reason"] == "length" and len(lp["tokens"]) == 8
    assert lp["tokens"] == [tok.decode([t]) for t in c.token_ids]
    assert lp["token_logprobs"] == pytest.approx([d[t].logprob for d, t in zip(c.logprobs, c.token_ids)])
    assert all(top[token] == value for top, token, value in zip(lp["top_logprobs"], lp["tokens"], lp["token_logprobs"]))
    if "\ufffd" not in "".join(lp["tokens"]):
        assert "".join(lp["tokens"]) == c.text
        assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(8)]
    assert rec["response"]["body"]["usage"] == {"prompt_tokens": len(tok.encode("Once upon a time", add_special_tokens=False)),
                                                "completion_tokens": 8, "total_tokens": len(out.prompt_token_ids) + 8}
