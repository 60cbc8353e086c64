"""Response bodies and stream chunks (fastdeploy/entrypoints/openai/responses.py) from hand-made
RequestOutputs: finished ones for the bodies, delta ones (the engine's streaming contract) for the
streams.

Oracles: the official `openai` client's pydantic models (every body and chunk must validate) and
its own stream accumulator (ChatCompletionStreamState), which joins chat chunks into the
completion a client sees; the hand-made completions themselves (their text, tokens and logprob
dicts split into deltas, so a joined stream must give back the whole); OpenAI's documented rules
(one finish_reason per choice, usage arithmetic, top_logprobs sizes, running text_offset)."""
import json

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from fastdeploy.engine.request import (
    CompletionOutput,
    CompletionOutputs,
    Logprob,
    RequestMetrics,
    RequestOutput,
    ToolCall,
)
from fastdeploy.entrypoints.openai.protocol import OpenAIError, parse_chat_request, parse_completion_request
from fastdeploy.entrypoints.openai.responses import (
    SSE_DONE,
    ChatStream,
    CompletionStream,
    chat_completion_body,
    completion_body,
    sse,
)

NAMES = ["m"]
MSGS = [{"role": "user", "content": "Hi"}]
K = 2  # top logprobs asked for


def logprob_dicts(token_ids, k=K):
    """Per token: the generated token plus k others; every third generated token is outside the top k."""
    out = []
    for i, t in enumerate(token_ids):
        outside = i % 3 == 2
        d = {1000 + j: Logprob(-0.1 * (j + 1), j + 1, f"alt{j}") for j in range(k)}
        d[t] = Logprob(-3.0 if outside else -0.1, k + 1 if outside else 1, f"<{t}>")
        if not outside and k:  # the generated token is rank 1: drop the last alternative
            d.pop(1000 + k - 1)
            for j in range(k - 1):
                d[1000 + j] = Logprob(-0.2 * (j + 1), j + 2, f"alt{j}")
        out.append(d)
    return out


def completion(index, pieces, finish="stop", reasoning=None, tool_calls=None, logprobs=False):
    """A finished completion from (token id, text piece) pairs; an empty piece is a token whose
    bytes are not complete text yet."""
    ids = [t for t, _ in pieces]
    return CompletionOutput(index=index, token_ids=ids, text="".join(p for _, p in pieces),
                            reasoning_content=reasoning, tool_calls=tool_calls, finish_reason=finish,
                            logprobs=logprob_dicts(ids) if logprobs else None, send_idx=len(ids))


def output(completions, prompt_ids=(1, 2, 3, 4), cached=2, prompt_logprobs=None):
    return RequestOutput(request_id="r", prompt=None, prompt_token_ids=list(prompt_ids),
                         outputs=CompletionOutputs(completions), finished=True,
                         metrics=RequestMetrics(arrival_time=0.0), num_cached_tokens=cached,
                         prompt_logprobs=prompt_logprobs)


def deltas(completions, pieces_of, reasoning_at=None, prompt_ids=(1, 2, 3, 4), cached=2, prompt_logprobs=None):
    """The engine's delta RequestOutputs for finished `completions`, one token per completion per
    step, interleaved; `pieces_of[i]` the (id, piece) pairs of completion i. Reasoning (when a
    completion has it) comes whole on its first delta; tool calls and finish_reason on the last."""
    steps = max(len(p) for p in pieces_of)
    out = []
    for s in range(steps):
        changed = []
        for c, pieces in zip(completions, pieces_of):
            if s >= len(pieces):
                continue
            last = s == len(pieces) - 1
            t, piece = pieces[s]
            changed.append(CompletionOutput(
                index=c.index, send_idx=s + 1, token_ids=[t], text=piece,
                reasoning_content=c.reasoning_content if s == 0 else None,
                logprobs=[c.logprobs[s]] if c.logprobs is not None else None,
                finish_reason=c.finish_reason if last else None, tool_calls=c.tool_calls if last else None))
        out.append(RequestOutput(request_id="r", prompt=None, prompt_token_ids=list(prompt_ids),
                                 outputs=CompletionOutputs(changed), finished=s == steps - 1,
                                 metrics=RequestMetrics(arrival_time=0.0), num_cached_tokens=cached,
                                 prompt_logprobs=prompt_logprobs if s == 0 else None))
    return out


PIECES = [(11, "Hel"), (12, "lo"), (13, ""), (14, "é!"), (15, " ok")]  # token 13: half of é
PIECES_B = [(21, "Bye"), (22, "")]


def run(stream, request_deltas, prompt_index=0):
    chunks = []
    for d in request_deltas:
        chunks += stream.feed(d, prompt_index)
    return chunks


def completion_chunk(chunk) -> Completion:
    """A text_completion chunk through the client's Completion model. The model requires a
    finish_reason while OpenAI's stream chunks carry null until the last (the client parses
    streams without validating), so a null one is checked to be present and validated as "stop"."""
    data = roundtrip(chunk)
    for choice in data["choices"]:
        assert "finish_reason" in choice
    parsed = Completion.model_validate({**data, "choices": [{**c, "finish_reason": c["finish_reason"] or "stop"}
                                                            for c in data["choices"]]})
    for choice, raw in zip(parsed.choices, data["choices"]):
        choice.finish_reason = raw["finish_reason"]
    return parsed


def roundtrip(chunk):
    text = sse(chunk)
    assert text.startswith("data: ") and text.endswith("\n\n")
    return json.loads(text[len("data: "):])


# ---- bodies -------------------------------------------------------------------------------------------
def test_chat_body_validates_with_usage_and_n():
    r = parse_chat_request({"messages": MSGS, "n": 2, "temperature": 1.0}, NAMES)
    out = output([completion(0, PIECES, reasoning="think"), completion(1, PIECES_B, finish="length")])
    body = ChatCompletion.model_validate(chat_completion_body(out, r.sampling_params, r.model))
    assert body.object == "chat.completion" and body.id.startswith("chatcmpl-") and body.model == "m"
    assert [c.message.content for c in body.choices] == ["Hello\u00e9! ok", "Bye"]
    assert [c.finish_reason for c in body.choices] == ["stop", "length"]
    assert body.choices[0].message.model_extra["reasoning_content"] == "think"
    assert "reasoning_content" not in body.choices[1].message.model_extra
    u = body.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (4, 7, 11)
    assert u.prompt_tokens_details.cached_tokens == 2


def test_chat_body_tool_calls():
    r = parse_chat_request({"messages": MSGS}, NAMES)
    call = ToolCall.of("get_weather", {"city": "Paris"})
    out = output([completion(0, [(5, "")], tool_calls=[call])])
    choice = ChatCompletion.model_validate(chat_completion_body(out, r.sampling_params, "m")).choices[0]
    assert choice.message.content is None and choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].id == call.id
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    out = output([completion(0, [(5, "")], tool_calls=[call], finish="length")])  # cut short: kept
    assert chat_completion_body(out, r.sampling_params, "m")["choices"][0]["finish_reason"] == "length"


def test_completion_body_several_prompts_index_and_usage():
    r = parse_completion_request({"prompt": ["a", "b"], "n": 2, "temperature": 1.0, "logprobs": K}, NAMES)
    outs = [output([completion(0, PIECES, logprobs=True), completion(1, PIECES_B, logprobs=True)], cached=1),
            output([completion(1, PIECES_B, logprobs=True), completion(0, PIECES, logprobs=True)],
                   prompt_ids=(7, 8), cached=0)]
    body = Completion.model_validate(completion_body(outs, r.sampling_params, "m"))
    assert body.object == "text_completion" and body.id.startswith("cmpl-")
    assert [c.index for c in body.choices] == [0, 1, 3, 2]  # prompt_i * n + j
    assert [c.text for c in body.choices] == ["Hello\u00e9! ok", "Bye", "Bye", "Hello\u00e9! ok"]
    u = body.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (6, 14, 20)
    assert u.prompt_tokens_details.cached_tokens == 1
    lp = body.choices[0].logprobs
    assert lp.tokens == [f"<{t}>" for t, _ in PIECES]
    assert lp.text_offset == [0, 4, 8, 12, 16]  # running over the token texts
    assert all(len(top) in (K, K + 1) for top in lp.top_logprobs)
    assert [len(top) for top in lp.top_logprobs] == [K, K, K + 1, K, K]  # + 1 where the token is outside the top k


def test_failed_output_is_a_500():
    r = parse_chat_request({"messages": MSGS}, NAMES)
    out = output([completion(0, PIECES, finish="abort")])
    out.error_code, out.error_msg = 500, "boom"
    with pytest.raises(OpenAIError) as info:
        chat_completion_body(out, r.sampling_params, "m")
    assert (info.value.status_code, info.value.message) == (500, "boom")
    with pytest.raises(OpenAIError):
        completion_body([out], r.sampling_params, "m")


# ---- chat streams -------------------------------------------------------------------------------------
def accumulate(chunks):
    """The client's own join of the chunks: (ParsedChatCompletion, the reasoning text per choice)."""
    state = ChatCompletionStreamState()
    reasoning = {}
    for chunk in chunks:
        parsed = ChatCompletionChunk.model_validate(roundtrip(chunk))
        for choice in parsed.choices:
            extra = choice.delta.model_extra or {}
            reasoning[choice.index] = reasoning.get(choice.index, "") + (extra.get("reasoning_content") or "")
        list(state.handle_chunk(parsed))
    return state.current_completion_snapshot, reasoning  # (get_final_completion refuses "length")


def test_chat_stream_joins_to_the_body_with_logprobs_and_n():
    r = parse_chat_request({"messages": MSGS, "n": 2, "temperature": 1.0, "logprobs": True, "top_logprobs": K,
                            "stream": True}, NAMES)
    comps = [completion(0, PIECES, reasoning="think", logprobs=True),
             completion(1, PIECES_B, finish="length", logprobs=True)]
    stream = ChatStream(r)
    chunks = run(stream, deltas(comps, [PIECES, PIECES_B])) + stream.finish()
    assert stream.finish() == []  # no include_usage: no usage chunk
    assert len({(c["id"], c["created"]) for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(len(c["choices"]) == 1 and c["usage"] is None and c["object"] == "chat.completion.chunk"
               for c in chunks)
    assert [c["choices"][0] for c in chunks[:2]] == [  # the opening: one role chunk per choice, in order
        {"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        for j in (0, 1)]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert all("role" not in c["delta"] for c in mine[1:])
        assert sum(c["finish_reason"] is not None for c in mine) == 1 and mine[-1]["finish_reason"] is not None
    joined, reasoning = accumulate(chunks)
    body = ChatCompletion.model_validate(chat_completion_body(output(comps), r.sampling_params, "m"))
    for got, want in zip(joined.choices, body.choices):
        assert (got.index, got.message.content, got.finish_reason) == (want.index, want.message.content,
                                                                        want.finish_reason)
        assert got.logprobs.content == want.logprobs.content
        assert all(len(e.top_logprobs) == K for e in got.logprobs.content)
    assert reasoning == {0: "think", 1: ""}
    # a token with no text yet still brings its logprobs
    empty = [c["choices"][0] for c in chunks[2:] if c["choices"][0]["logprobs"]["content"][0]["token"] == "<13>"]
    assert len(empty) == 1 and "content" not in empty[0]["delta"]


def test_chat_stream_without_logprobs_skips_empty_deltas():
    r = parse_chat_request({"messages": MSGS, "stream": True}, NAMES)
    stream = ChatStream(r)
    comp = completion(0, PIECES)
    chunks = run(stream, deltas([comp], [PIECES]))
    assert len(chunks) == 1 + len(PIECES) - 1  # the opening; the token without text says nothing
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == comp.text
    assert accumulate(chunks)[0].choices[0].message.content == comp.text


def test_chat_stream_tool_calls():
    r = parse_chat_request({"messages": MSGS, "stream": True}, NAMES)
    calls = [ToolCall.of("get_weather", {"city": "Paris"}), ToolCall.of("get_time", {})]
    comp = completion(0, [(5, ""), (6, "")], tool_calls=calls)
    chunks = run(ChatStream(r), deltas([comp], [[(5, ""), (6, "")]]))
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and [c["index"] for c in last["delta"]["tool_calls"]] == [0, 1]
    joined = accumulate(chunks)[0].choices[0]
    body = ChatCompletion.model_validate(chat_completion_body(output([comp]), r.sampling_params, "m")).choices[0]
    assert [(t.id, t.function.name, t.function.arguments) for t in joined.message.tool_calls] == \
        [(t.id, t.function.name, t.function.arguments) for t in body.message.tool_calls]
    assert joined.finish_reason == body.finish_reason == "tool_calls"


def test_stream_usage_last_chunk_and_continuous():
    body = {"messages": MSGS, "n": 2, "temperature": 1.0, "stream": True}
    comps = [completion(0, PIECES), completion(1, PIECES_B)]
    r = parse_chat_request({**body, "stream_options": {"include_usage": True}}, NAMES)
    stream = ChatStream(r)
    chunks = run(stream, deltas(comps, [PIECES, PIECES_B], cached=3)) + stream.finish()
    assert all(c["usage"] is None for c in chunks[:-1])
    final = ChatCompletionChunk.model_validate(roundtrip(chunks[-1]))
    assert final.choices == [] and final.id == chunks[0]["id"]
    assert (final.usage.prompt_tokens, final.usage.completion_tokens, final.usage.total_tokens) == (4, 7, 11)
    assert final.usage.prompt_tokens_details.cached_tokens == 3

    r = parse_chat_request({**body, "stream_options": {"continuous_usage_stats": True}}, NAMES)
    stream, fed, seen = ChatStream(r), 0, []
    for d in deltas(comps, [PIECES, PIECES_B]):
        before, fed = fed, fed + sum(len(c.token_ids) for c in d.outputs)
        for chunk in stream.feed(d):
            u = chunk["usage"]
            if "role" in chunk["choices"][0]["delta"]:  # the opening chunks: nothing generated yet
                assert u["completion_tokens"] == 0
                continue
            assert before < u["completion_tokens"] <= fed and u["prompt_tokens"] == 4
            assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
            seen.append(u["completion_tokens"])
    assert seen == sorted(seen) and seen[-1] == 7 and stream.finish() == []


def test_chat_stream_prompt_logprobs_once():
    r = parse_chat_request({"messages": MSGS, "stream": True, "prompt_logprobs": 1}, NAMES)
    plp = [None, {2: Logprob(-1.5, 1, "b")}]
    chunks = run(ChatStream(r), deltas([completion(0, PIECES)], [PIECES], prompt_logprobs=plp))
    assert [("prompt_logprobs" in c) for c in chunks] == [True] + [False] * (len(chunks) - 1)
    assert chunks[0]["prompt_logprobs"] == [None, {"2": {"logprob": -1.5, "rank": 1, "decoded_token": "b"}}]


def test_a_second_finish_is_an_error():
    r = parse_chat_request({"messages": MSGS, "stream": True}, NAMES)
    stream = ChatStream(r)
    d = deltas([completion(0, PIECES_B)], [PIECES_B])
    run(stream, d)
    with pytest.raises(ValueError, match="choice 0 finished twice"):
        stream.feed(d[-1])


# ---- completion streams -------------------------------------------------------------------------------
def test_completion_stream_several_prompts_joins_to_the_body():
    r = parse_completion_request({"prompt": ["a", "b"], "n": 2, "temperature": 1.0, "logprobs": K, "stream": True,
                                  "stream_options": {"include_usage": True}}, NAMES)
    per_prompt = [[completion(0, PIECES, logprobs=True), completion(1, PIECES_B, finish="length", logprobs=True)],
                  [completion(0, PIECES_B, logprobs=True), completion(1, PIECES, logprobs=True)]]
    pieces = [[PIECES, PIECES_B], [PIECES_B, PIECES]]
    stream = CompletionStream(r)
    streams = [deltas(per_prompt[i], pieces[i], prompt_ids=(1, 2, 3, 4)[: 4 - i], cached=i) for i in (0, 1)]
    chunks = []
    for d0, d1 in zip(*streams):  # the two prompts' deltas interleaved, as the server merges them
        chunks += stream.feed(d0, 0) + stream.feed(d1, 1)
    chunks += stream.finish()
    parsed = [completion_chunk(c) for c in chunks[:-1]]
    assert len({(c.id, c.created) for c in parsed}) == 1 and all(len(c.choices) == 1 for c in parsed)
    body = Completion.model_validate(completion_body(
        [output(per_prompt[i], prompt_ids=(1, 2, 3, 4)[: 4 - i], cached=i) for i in (0, 1)], r.sampling_params, "m"))
    for want in body.choices:
        mine = [c.choices[0] for c in parsed if c.choices[0].index == want.index]
        assert "".join(c.text for c in mine) == want.text
        assert [c.finish_reason for c in mine if c.finish_reason is not None] == [want.finish_reason]
        joined = {key: sum((getattr(c.logprobs, key) for c in mine), []) for key in
                  ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
        assert joined == want.logprobs.model_dump()
    final = chunks[-1]
    assert final["choices"] == [] and final["usage"] == body.usage.model_dump(exclude_none=True)
    assert final["usage"]["prompt_tokens"] == 4 + 3 and final["usage"]["prompt_tokens_details"] == {"cached_tokens": 1}


def test_completion_stream_prompt_logprobs_on_each_choice_once():
    r = parse_completion_request({"prompt": "a", "n": 2, "temperature": 1.0, "stream": True, "prompt_logprobs": 0},
                                 NAMES)
    plp = [None, {2: Logprob(-1.5, 1, "b")}]
    comps = [completion(0, PIECES), completion(1, PIECES_B)]
    d = deltas(comps, [PIECES, PIECES_B], prompt_logprobs=plp)
    d[0].outputs = CompletionOutputs([d[0].outputs[0]])  # completion 1 starts a step later
    d[1].outputs.insert(0, CompletionOutput(index=1, token_ids=[21], text="Bye", send_idx=1))
    chunks = run(CompletionStream(r), d)
    with_plp = [c["choices"][0]["index"] for c in chunks if "prompt_logprobs" in c["choices"][0]]
    assert with_plp == [0, 1]


def test_sse_lines():
    assert sse({"a": "é"}) == 'data: {"a": "é"}\n\n'
    assert SSE_DONE == "data: [DONE]\n\n"
    with pytest.raises(ValueError):
        sse({"x": float("nan")})
