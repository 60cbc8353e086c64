"""Streamed prompts (LLMEngine.enqueue(stream=True)): the deltas, joined, are the non-streamed output.

The oracle is the same prompt run without streaming (LLM.generate): token ids, text, reasoning,
logprobs, finish and stop reasons and tool calls must all agree, and the deltas must keep the
contract of output/stream_delta.py (new parts only, one finish per completion, the last delta
finished=True, nothing sent that the final text takes back).
"""
import json
import re

import pytest

from fastdeploy import SamplingParams
from fastdeploy.engine.sampling_params import GuidedDecodingParams
from fastdeploy.reasoning import get_reasoning_parser
from fastdeploy.tool_parsers import get_tool_parser


def run_streamed(engine, prompt_ids, params):
    """Every delta of one streamed prompt, stepping the engine until it finishes."""
    request_id = engine.enqueue(engine.make_request(None, prompt_ids, params), stream=True)
    deltas = []
    while engine.has_unfinished_requests():
        deltas += [o for o in engine.step() if o.request_id == request_id]
    return deltas


def join(deltas, n):
    """Per completion index: the joined fields and the finish reasons seen."""
    joined = {i: dict(token_ids=[], text="", reasoning=None, logprobs=[], finishes=[], tool_calls=None,
                      stop_reason=None) for i in range(n)}
    for delta in deltas:
        for c in delta.outputs:
            j = joined[c.index]
            assert c.token_ids or c.finish_reason is not None, "a delta that says nothing"
            j["token_ids"] += c.token_ids
            j["text"] += c.text
            if c.reasoning_content is not None:
                j["reasoning"] = (j["reasoning"] or "") + c.reasoning_content
            if c.logprobs is not None:
                j["logprobs"] += c.logprobs
            if c.finish_reason is not None:
                j["finishes"].append(c.finish_reason)
                j["tool_calls"], j["stop_reason"] = c.tool_calls, c.stop_reason
            else:
                assert c.tool_calls is None, "tool calls before the completion finished"
            assert c.send_idx == len(j["token_ids"])
    return joined


def assert_same_as_whole(llm, prompt_ids, params):
    whole = llm.generate({"prompt_token_ids": prompt_ids}, params, use_tqdm=False)[0]
    deltas = run_streamed(llm.llm_engine, prompt_ids, params)
    assert deltas and deltas[-1].finished and not any(d.finished for d in deltas[:-1])
    joined = join(deltas, params.n)
    for c in whole.outputs:
        j = joined[c.index]
        assert j["finishes"] == [c.finish_reason]
        assert j["token_ids"] == c.token_ids
        assert j["text"] == c.text
        assert j["reasoning"] == c.reasoning_content
        assert j["stop_reason"] == c.stop_reason
        if c.logprobs is not None:
            assert [{t: lp.logprob for t, lp in d.items()} for d in j["logprobs"]] == \
                   [{t: lp.logprob for t, lp in d.items()} for d in c.logprobs]
        calls = lambda cs: [(t.function.name, json.loads(t.function.arguments)) for t in cs or []]  # noqa: E731
        assert calls(j["tool_calls"]) == calls(c.tool_calls)
    return deltas, joined


@pytest.fixture
def prompt(tok):
    return tok.encode("Once upon a time, in a small village,")


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=24),
    SamplingParams(temperature=0, max_tokens=40, stop=[" the", ".\n"]),
    SamplingParams(temperature=0, max_tokens=40, stop=[" the"], include_stop_str_in_output=True),
    SamplingParams(temperature=0.8, seed=7, n=3, max_tokens=16, logprobs=2),
    SamplingParams(temperature=0, max_tokens=12, logprobs=0, prompt_logprobs=1),
], ids=["greedy", "stop-strings", "stop-included", "n3-logprobs", "prompt-logprobs"])
def test_joined_deltas_equal_the_whole_output(smollm_llm, prompt, params):
    deltas, _ = assert_same_as_whole(smollm_llm, prompt, params)
    with_prompt_logprobs = [d for d in deltas if d.prompt_logprobs is not None]
    assert len(with_prompt_logprobs) == (1 if params.prompt_logprobs is not None else 0)
    if params.prompt_logprobs is not None:
        assert with_prompt_logprobs[0] is deltas[0] and len(deltas[0].prompt_logprobs) == len(prompt)


def test_a_stop_string_tail_is_held_back_until_it_is_decided(smollm_llm, tok, prompt):
    """The stop string is the model's own continuation, so it is completed over several tokens: no
    delta may show a character of it (the final text is cut before it)."""
    free = smollm_llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=20),
                               use_tqdm=False)[0].outputs.text
    stop = free[5:14]  # a stop string that starts inside one token and ends inside a later one
    deltas, joined = assert_same_as_whole(smollm_llm, prompt, SamplingParams(temperature=0, max_tokens=20,
                                                                             stop=[stop]))
    assert joined[0]["text"] == free[:5] and joined[0]["finishes"] == ["stop"]
    sent = ""
    for d in deltas:
        sent += "".join(c.text for c in d.outputs)
        assert stop[:1] not in sent[5:], "a character of the stop string was sent"


@pytest.mark.parametrize("prompt_tail, output, reasoning, answer", [
    ("", "<think>plan one two</think>the answer", "plan one two", "the answer"),  # the model opens it
    (" <think>\n", "plan one two</think> the answer", "plan one two", "the answer"),  # the prompt opens it
    (" <think>x</think>", "plain answer text here", None, "plain answer text here"),  # closed in the prompt
])
def test_reasoning_streams_as_its_own_field(smollm_llm, tok, monkeypatch, prompt, prompt_tail, output, reasoning,
                                            answer):
    monkeypatch.setattr(smollm_llm.llm_engine.output_processor, "reasoning_parser", get_reasoning_parser("qwen3"))
    prompt = prompt + (tok.encode(prompt_tail) if prompt_tail else [])
    regex = output.replace("\n", "\\n")
    params = SamplingParams(temperature=0, max_tokens=40, guided_decoding=GuidedDecodingParams(regex=regex))
    deltas, joined = assert_same_as_whole(smollm_llm, prompt, params)
    assert joined[0]["reasoning"] == reasoning and joined[0]["text"] == answer
    pieces = [d.outputs[0] for d in deltas if d.outputs]
    if reasoning is not None:  # reasoning streams as it is made; the answer starts after it
        assert sum(1 for c in pieces if c.reasoning_content) > 1
        first_answer = next(i for i, c in enumerate(pieces) if c.text)
        assert all(not c.reasoning_content for c in pieces[first_answer:])
    else:
        assert sum(1 for c in pieces if c.text) > 1


def test_a_completion_cut_inside_its_thinking_streams_reasoning_only(smollm_llm, tok, monkeypatch, prompt):
    """The documented departure: max_tokens inside the thinking; the stream never re-sends it as content."""
    monkeypatch.setattr(smollm_llm.llm_engine.output_processor, "reasoning_parser", get_reasoning_parser("qwen3"))
    params = SamplingParams(temperature=0, max_tokens=6)
    deltas = run_streamed(smollm_llm.llm_engine, prompt + tok.encode(" <think>\n"), params)
    joined = join(deltas, 1)[0]
    whole = smollm_llm.generate({"prompt_token_ids": prompt + tok.encode(" <think>\n")}, params,
                                use_tqdm=False)[0].outputs
    assert whole.reasoning_content is None and whole.text  # FastDeploy's rule: no end tag, all answer
    assert joined["text"] == "" and joined["reasoning"] == whole.text.strip()


def test_tool_call_answers_come_whole_on_the_last_delta(smollm_llm, monkeypatch, prompt):
    monkeypatch.setattr(smollm_llm.llm_engine.output_processor, "tool_parser", get_tool_parser("hermes"))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    params = SamplingParams(temperature=0, max_tokens=60,
                            guided_decoding=GuidedDecodingParams(regex=re.escape("Let me check." + call)))
    deltas, joined = assert_same_as_whole(smollm_llm, prompt, params)
    assert [t.function.name for t in joined[0]["tool_calls"]] == ["get_weather"]
    assert joined[0]["text"] == "Let me check."
    assert all(c.text == "" for d in deltas[:-1] for c in d.outputs), "answer text sent before the calls were read"


def test_an_aborted_stream_ends_with_one_abort_delta(smollm_llm, prompt):
    engine = smollm_llm.llm_engine
    request_id = engine.enqueue(engine.make_request(None, prompt, SamplingParams(temperature=0, max_tokens=50)),
                                stream=True)
    deltas = [o for _ in range(4) for o in engine.step()]
    last = engine.abort_request(request_id)
    assert not engine.has_unfinished_requests()
    assert last.finished and [c.finish_reason for c in last.outputs] == ["abort"]
    joined = join(deltas + [last], 1)[0]
    assert joined["finishes"] == ["abort"] and len(joined["token_ids"]) == len(deltas)
