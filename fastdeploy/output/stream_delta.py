"""Streamed completions: what a completion adds in one step, as a delta CompletionOutput.

A streamed prompt (`LLMEngine.enqueue(..., stream=True)`) gets a RequestOutput every step in which
one of its completions advanced. Each of its CompletionOutputs carries only what is new since the
last delta: `token_ids`, `text`, `reasoning_content` and `logprobs` are the new part,
`finish_reason`/`stop_reason`/`tool_calls` are set once, on the completion's last delta, and
`send_idx` counts the tokens generated so far. Joining the deltas gives the non-streamed output.

What is held back while the completion runs, so that nothing sent is ever taken back:
- the last `max(len(stop)) - 1` characters of the answer when the request has stop strings (a stop
  string completed by a later token cuts them off; vLLM holds back the same way);
- the whole answer when the completion's tool calls are read (the calls are parsed from the
  finished text; the text outside them and the calls come on the last delta);
- with a reasoning parser, the split of the text so far into reasoning and answer is recomputed
  each step (the parser's `split_unfinished`: while the thinking is open, everything so far is
  reasoning) and each field sends what it gained; a field whose text did not grow past what was
  sent sends nothing until it does.

Two departures from the non-streamed output, both where the thinking's start is not known while
the completion runs:
- a completion that ends inside its thinking (say, at max_tokens before `</think>`) has streamed
  that text as reasoning_content and finishes so; the non-streamed output gives such text as the
  answer (FastDeploy's rule for a missing end tag);
- a completion whose thinking was not opened (no `<think>` left open by the prompt, none leading
  the output) but which then writes `</think>` has streamed the text before it as answer; the
  non-streamed output splits it there (reasoning before the tag, answer after).
"""
from __future__ import annotations

from typing import Optional

from fastdeploy.engine.request import CompletionOutput
from fastdeploy.output.request_state import RequestState, SentSoFar


def held_back(state: RequestState) -> Optional[int]:
    """Characters of a running completion's answer not to send yet; None: all of it."""
    if state.read_tool_calls is not None:
        return None
    stops = state.sampling_params.stop_strings
    return max(len(s) for s in stops) - 1 if stops and not state.sampling_params.include_stop_str_in_output else 0


def visible_answer(answer: str, state: RequestState) -> str:
    """The part of a running completion's answer that may be sent."""
    hold = held_back(state)
    if hold is None:
        return ""
    return answer[: len(answer) - hold] if hold else answer


def streamed_as_reasoning(state: RequestState) -> bool:
    """Whether a finished completion's deltas carried reasoning (its final split must keep it so)."""
    return state.sent is not None and state.sent.reasoning > 0


def has_news(state: RequestState) -> bool:
    """Whether the completion has anything its deltas have not carried: tokens or its finish."""
    sent = state.sent if state.sent is not None else SentSoFar()
    return not sent.finished and (sent.tokens < len(state.output_token_ids) or state.finished)


def take_delta(state: RequestState, current: CompletionOutput) -> CompletionOutput:
    """The delta of `current` (the completion as it stands: its whole answer and reasoning so far,
    with running completions' held-back text removed) past what `state.sent` records; advances it."""
    sent = state.sent if state.sent is not None else SentSoFar()
    reasoning = current.reasoning_content
    delta = CompletionOutput(
        index=current.index,
        send_idx=current.send_idx,
        token_ids=current.token_ids[sent.tokens:],
        text=current.text[sent.text:],
        reasoning_content=reasoning[sent.reasoning:] if reasoning is not None and len(reasoning) > sent.reasoning
        else None,
        tool_calls=current.tool_calls,
        finish_reason=current.finish_reason,
        stop_reason=current.stop_reason,
        cumulative_logprob=current.cumulative_logprob,
        logprobs=current.logprobs[sent.logprobs:] if current.logprobs is not None else None,
    )
    state.sent = SentSoFar(tokens=len(current.token_ids), text=max(sent.text, len(current.text)),
                           reasoning=max(sent.reasoning, len(reasoning or "")),
                           logprobs=len(current.logprobs) if current.logprobs is not None else 0,
                           finished=current.finish_reason is not None)
    return delta
