"""The OpenAI contract of a real API server (the default model on 127.0.0.1), seen through the
official `openai` client and, for the SSE framing, raw HTTP: streams, usage, n, logprobs and the
sampling keys.

Oracles: the SSE and chunk rules of OpenAI's API reference (`data: {json}` events ending in
`data: [DONE]`, one finish_reason per choice, one id per response, a last usage chunk with no
choices); the same request answered without streaming (a greedy stream joins to the same text);
the tokenizer read from the GGUF file (prompt token counts); the same tokens scored again as a
prompt (prompt_logprobs: the prefill path) for the generated tokens' logprobs; greedy answers for
top_k=1 and min_p=1 (both keep only the most likely token); the unstopped greedy text for stop
strings; OpenAI's logprob shapes (k top entries, most likely first, running text_offset).
"""
import json

import httpx
import openai
import pytest

from running_server import RunningServer

MAX_LOGPROBS = 20  # the server's default --max-logprobs
MSGS = [{"role": "user", "content": "Name three fruits."}]
PROMPT = "Once upon a time"
PROMPT2 = "The capital of France is"


@pytest.fixture(scope="module")
def server():
    with RunningServer("--max-model-len", "512", "--max-num-seqs", "16") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return server.client(timeout=60)


@pytest.fixture(scope="module")
def tok():
    """The default model's tokenizer, read from its GGUF file (the oracle for prompt token counts)."""
    from fastdeploy.input.gguf_tokenizer import load_gguf_tokenizer
    from fastdeploy.model_executor.model_loader.gguf_file import GGUFFile
    from fastdeploy.model_executor.model_loader.model_path import default_model_path

    return load_gguf_tokenizer(GGUFFile(default_model_path()))


def chat(client, server, **kwargs):
    kwargs.setdefault("messages", MSGS)
    kwargs.setdefault("max_tokens", 12)
    return client.chat.completions.create(model=server.model, **kwargs)


def complete(client, server, **kwargs):
    kwargs.setdefault("prompt", PROMPT)
    kwargs.setdefault("max_tokens", 12)
    return client.completions.create(model=server.model, **kwargs)


def joined(chunks, field="content"):
    """Per choice index: the streamed text joined (chat `delta.<field>`, completion `text`)."""
    out = {}
    for chunk in chunks:
        for c in chunk.choices:
            piece = getattr(c.delta, field) if hasattr(c, "delta") else c.text
            out[c.index] = out.get(c.index, "") + (piece or "")
    return out


def finish_reasons(chunks):
    """Per choice index: every finish_reason its chunks carried."""
    out = {}
    for chunk in chunks:
        for c in chunk.choices:
            out.setdefault(c.index, [])
            if c.finish_reason is not None:
                out[c.index].append(c.finish_reason)
    return out


# ---- SSE framing -------------------------------------------------------------------------------
@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions", {"messages": MSGS, "n": 2, "temperature": 0.8, "seed": 3}),
    ("/v1/completions", {"prompt": [PROMPT, PROMPT2], "n": 2, "temperature": 0.8, "seed": 3}),
])
def test_sse_framing(server, route, body):
    body = {"model": server.model, "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}, **body}
    with httpx.stream("POST", server.url + route, json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("\n\n")
    events = raw[:-2].split("\n\n")
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert len({c["created"] for c in chunks}) == 1
    kind = "chat.completion.chunk" if "messages" in body else "text_completion"
    assert {c["object"] for c in chunks} == {kind}
    choices = len(body.get("prompt", [0])) * body["n"]
    reasons = {}
    for c in chunks[:-1]:
        for choice in c["choices"]:
            if choice["finish_reason"] is not None:
                reasons.setdefault(choice["index"], []).append(choice["finish_reason"])
    assert sorted(reasons) == list(range(choices))
    assert all(len(r) == 1 and r[0] in ("stop", "length") for r in reasons.values())
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


# ---- streamed == non-streamed ----------------------------------------------------------------------
def test_chat_stream_equals_body_under_greedy(client, server):
    body = chat(client, server, temperature=0, max_tokens=16, logprobs=True)
    chunks = list(chat(client, server, temperature=0, max_tokens=16, logprobs=True, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert joined(chunks) == {0: body.choices[0].message.content}
    assert finish_reasons(chunks) == {0: [body.choices[0].finish_reason]}
    streamed_tokens = [t.token for ch in chunks for c in ch.choices if c.logprobs for t in c.logprobs.content]
    assert streamed_tokens == [t.token for t in body.choices[0].logprobs.content]
    assert len(streamed_tokens) == body.usage.completion_tokens
    text = "".join(streamed_tokens)  # a completion that ended by itself also lists its end-of-sequence token
    eos = text[len(body.choices[0].message.content):]
    assert text.startswith(body.choices[0].message.content)
    assert eos == ("<|im_end|>" if body.choices[0].finish_reason == "stop" else "")


def test_completion_stream_equals_body_under_greedy(client, server):
    body = complete(client, server, temperature=0, max_tokens=16, logprobs=0)
    chunks = list(complete(client, server, temperature=0, max_tokens=16, logprobs=0, stream=True))
    assert joined(chunks) == {0: body.choices[0].text}
    assert finish_reasons(chunks) == {0: [body.choices[0].finish_reason]}
    tokens = [t for ch in chunks for c in ch.choices if c.logprobs for t in c.logprobs.tokens]
    offsets = [o for ch in chunks for c in ch.choices if c.logprobs for o in c.logprobs.text_offset]
    assert tokens == body.choices[0].logprobs.tokens and len(tokens) == body.usage.completion_tokens
    assert offsets == body.choices[0].logprobs.text_offset  # running across the chunks


# ---- usage ---------------------------------------------------------------------------------------
def test_include_usage_last_chunk(client, server, tok):
    chunks = list(chat(client, server, temperature=0, stream=True, stream_options={"include_usage": True}))
    *body, last = chunks
    assert last.choices == [] and all(c.usage is None for c in body)
    rendered = tok.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=False)
    assert last.usage.prompt_tokens == len(tok(rendered, add_special_tokens=False)["input_ids"])
    assert last.usage.completion_tokens == chat(client, server, temperature=0).usage.completion_tokens
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens

    chunks = list(complete(client, server, prompt=[PROMPT, PROMPT2], max_tokens=5, stream=True,
                           stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    usage = chunks[-1].usage
    assert usage.prompt_tokens == sum(len(tok(p, add_special_tokens=False)["input_ids"]) for p in (PROMPT, PROMPT2))
    assert usage.completion_tokens == 10 and usage.total_tokens == usage.prompt_tokens + 10


def test_no_usage_without_stream_options(client, server):
    chunks = list(chat(client, server, max_tokens=4, stream=True))
    assert chunks and all(c.usage is None for c in chunks)
    chunks = list(complete(client, server, max_tokens=4, stream=True, stream_options={"include_usage": False}))
    assert chunks and all(c.usage is None for c in chunks)


def test_continuous_usage_stats(client, server):
    chunks = list(complete(client, server, max_tokens=6, stream=True, extra_body={"ignore_eos": True},
                           stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert all(c.usage is not None for c in chunks)
    generated = [c.usage.completion_tokens for c in chunks]
    assert generated == sorted(generated) and generated[-1] == 6
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks)


@pytest.mark.parametrize("stream", [False, None])
def test_stream_options_without_stream_is_400(client, server, stream):
    kwargs = {} if stream is None else {"stream": stream}
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, server, stream_options={"include_usage": True}, **kwargs)
    assert e.value.status_code == 400 and "stream_options" in e.value.message


# ---- n -------------------------------------------------------------------------------------------
def test_n_choices_indexed_and_interleaved(client, server):
    params = dict(n=3, temperature=1.0, seed=11, max_tokens=8)
    body = chat(client, server, **params)
    assert [c.index for c in body.choices] == [0, 1, 2]
    assert body.usage.completion_tokens == sum(
        len(c.logprobs.content) for c in chat(client, server, logprobs=True, **params).choices)

    chunks = list(chat(client, server, stream=True, **params))
    reasons = finish_reasons(chunks)
    assert sorted(reasons) == [0, 1, 2] and all(len(r) == 1 for r in reasons.values())
    assert joined(chunks) == {c.index: c.message.content for c in body.choices}  # same seed, same samples
    order = [c.index for ch in chunks for c in ch.choices if c.delta.content]
    last_of = {i: max(k for k, j in enumerate(order) if j == i) for i in range(3)}
    first_of = {i: order.index(i) for i in range(3)}
    assert max(first_of.values()) < min(last_of.values())  # every choice streams before any has ended


def test_several_prompts_choice_order(client, server):
    """Choice i * n + j is prompt i's completion j (top_k=1 samples the greedy answer: each equals
    the prompt's greedy answer alone)."""
    alone = [complete(client, server, prompt=p, temperature=0, max_tokens=6).choices[0].text for p in (PROMPT, PROMPT2)]
    both = dict(prompt=[PROMPT, PROMPT2], n=2, temperature=1.0, max_tokens=6, extra_body={"top_k": 1})
    body = complete(client, server, **both)
    assert [c.index for c in body.choices] == [0, 1, 2, 3]
    assert [c.text for c in body.choices] == [alone[0], alone[0], alone[1], alone[1]]
    chunks = list(complete(client, server, stream=True, **both))
    assert joined(chunks) == {0: alone[0], 1: alone[0], 2: alone[1], 3: alone[1]}
    assert all(len(r) == 1 for r in finish_reasons(chunks).values())


# ---- logprobs ------------------------------------------------------------------------------------
def test_chat_logprobs_shape_and_greedy_argmax(client, server):
    k = 3
    body = chat(client, server, temperature=0, max_tokens=8, logprobs=True, top_logprobs=k)
    content = body.choices[0].logprobs.content
    assert len(content) == body.usage.completion_tokens
    for entry in content:
        tops = entry.top_logprobs
        assert len(tops) == k
        values = [t.logprob for t in tops]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert tops[0].token == entry.token and tops[0].logprob == entry.logprob  # greedy = argmax
        assert entry.bytes == list(entry.token.encode())
        assert sum(2.718281828 ** v for v in values) <= 1 + 1e-4
    assert "".join(e.token for e in content).startswith(body.choices[0].message.content)


def test_generated_logprobs_equal_the_prompt_scoring_of_the_same_tokens(client, server, tok):
    """The logprob of each generated token equals its logprob when the same tokens are sent back
    as a prompt (prompt_logprobs: the prefill path scores them again)."""
    prompt_ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    body = complete(client, server, prompt=prompt_ids, temperature=0, max_tokens=6, logprobs=1,
                    extra_body={"ignore_eos": True})
    c = body.choices[0]
    generated = tok(c.text, add_special_tokens=False)["input_ids"]
    rescored = complete(client, server, prompt=prompt_ids + generated, max_tokens=1,
                        extra_body={"prompt_logprobs": 0}).choices[0]
    per_token = rescored.model_extra["prompt_logprobs"][len(prompt_ids):]
    assert len(per_token) == len(c.logprobs.tokens)  # the text re-tokenizes to the same tokens
    for entry, token, logprob in zip(per_token, c.logprobs.tokens, c.logprobs.token_logprobs):
        (scored,) = [v for v in entry.values() if v["decoded_token"] == token]
        assert scored["logprob"] == pytest.approx(logprob, abs=2e-3)


def test_completion_logprobs_shape(client, server):
    k = 2
    c = complete(client, server, temperature=0.7, seed=5, max_tokens=8, logprobs=k).choices[0]
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert "".join(lp.tokens) == c.text
    offset = 0
    for token, logprob, top, text_offset in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset):
        assert text_offset == offset
        offset += len(token)
        assert len(top) in (k, k + 1) and top[token] == logprob  # the k most likely and the sampled one
        if len(top) == k + 1:  # the sampled token is not among the k most likely
            assert logprob <= min(v for t, v in top.items() if t != token)


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
def test_logprobs_above_max_is_400_and_the_server_goes_on(client, server, endpoint):
    with pytest.raises(openai.BadRequestError) as e:
        if endpoint == "chat":
            chat(client, server, logprobs=True, top_logprobs=MAX_LOGPROBS + 1)
        else:
            complete(client, server, logprobs=MAX_LOGPROBS + 1)
    assert e.value.status_code == 400 and str(MAX_LOGPROBS) in e.value.message
    assert e.value.body["type"] == "invalid_request_error"
    ok = complete(client, server, logprobs=MAX_LOGPROBS, max_tokens=2, temperature=0)
    assert len(ok.choices[0].logprobs.top_logprobs[0]) >= MAX_LOGPROBS


# ---- sampling keys -------------------------------------------------------------------------------
def test_max_tokens_and_max_completion_tokens(client, server):
    c = complete(client, server, max_tokens=5, extra_body={"ignore_eos": True})
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 5
    c = chat(client, server, max_tokens=None, max_completion_tokens=4, extra_body={"ignore_eos": True})
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, server, max_tokens=3, max_completion_tokens=4)
    assert "max_completion_tokens" in e.value.message


def test_stop_string(client, server):
    free = complete(client, server, temperature=0, max_tokens=16, extra_body={"ignore_eos": True}).choices[0].text
    words = free.split()
    stop = words[len(words) // 2]  # a word from the middle of the unstopped text
    want = free[:free.index(stop)]
    for stream in (False, True):
        out = complete(client, server, temperature=0, max_tokens=16, stop=[stop], stream=stream)
        if stream:
            out = list(out)
            assert joined(out) == {0: want} and finish_reasons(out) == {0: ["stop"]}
        else:
            assert out.choices[0].text == want and out.choices[0].finish_reason == "stop"
            assert stop not in out.choices[0].text


def test_seed(client, server):
    def sampled(seed):
        return complete(client, server, temperature=1.0, seed=seed, max_tokens=8,
                        extra_body={"ignore_eos": True}).choices[0].text

    assert sampled(7) == sampled(7)
    assert len({sampled(s) for s in (1, 2, 3)}) > 1


def test_top_k_and_min_p_extra_keys(client, server):
    greedy = complete(client, server, temperature=0, max_tokens=10, extra_body={"ignore_eos": True}).choices[0].text
    for extra in ({"top_k": 1}, {"min_p": 1.0}):  # each keeps only the most likely token
        out = complete(client, server, temperature=1.0, seed=1, max_tokens=10, extra_body={"ignore_eos": True, **extra})
        assert out.choices[0].text == greedy, extra


def test_penalties_extra_keys(client, server):
    neutral = dict(presence_penalty=0.0, frequency_penalty=0.0, extra_body={"repetition_penalty": 1.0})
    greedy = chat(client, server, temperature=0).choices[0].message.content
    assert chat(client, server, temperature=0, **neutral).choices[0].message.content == greedy
    penalized = chat(client, server, temperature=0, max_tokens=12, presence_penalty=2.0, frequency_penalty=2.0,
                     extra_body={"repetition_penalty": 1.5})
    assert penalized.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, server, presence_penalty=2.5)
    assert "presence_penalty" in e.value.message and e.value.body["param"] == "presence_penalty"
