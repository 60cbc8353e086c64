"""Output processor: the model runner's tokens and logprobs -> text, stops, logprob dicts, RequestOutputs.

Per step it appends each sampled token to its completion (output/stop_checker.py: detokenize,
EOS, stop tokens, stop strings, max_tokens), turns logprobs arrays into the public
{token_id: Logprob} dicts, and returns the ids of the completions that finished (the engine tells
the scheduler) and the RequestOutputs of prompts whose `n` completions have all finished. A
completion whose output handling raises fails alone (finish_reason "abort", error_code 500); the
rest of the batch goes on.

When a completion finishes, its text is split by the reasoning parser (if any), then the tool
parser (if any) reads the calls in the answer that follows the thinking: `tool_calls` is filled
and `text` keeps what the model wrote outside the calls (tool_parsers/base.py `parse_completion`).
`set_tool_call_reader` replaces that step for one prompt (LLM.chat's tool_choice: "none" reads
nothing, a forced call reads the JSON its schema produced).

A streamed prompt (`add_prompt(..., stream=True)`) gets a delta RequestOutput every step one of its
completions advances (finished=True on the last), rather than one RequestOutput at the end:
output/stream_delta.py says what each delta carries and what it holds back.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

from fastdeploy.engine.pooling_output import OUTPUT_CLASSES, PoolingRequestOutput
from fastdeploy.engine.request import CompletionOutput, CompletionOutputs, RequestMetrics, RequestOutput
from fastdeploy.output.detokenizer import IncrementalDetokenizer
from fastdeploy.output.logprobs import TokenTexts, logprobs_dict
from fastdeploy.output.request_state import GroupState, RequestState
from fastdeploy.output.stop_checker import append_token
from fastdeploy.output.stream_delta import has_news, streamed_as_reasoning, take_delta, visible_answer
from fastdeploy.worker.output import ModelRunnerOutput

logger = logging.getLogger("fastdeploy")


class OutputProcessor:
    def __init__(self, tokenizer, reasoning_parser=None, tool_parser=None):
        self.tokenizer = tokenizer
        self.token_texts = TokenTexts(tokenizer)
        self.reasoning_parser = reasoning_parser
        self.tool_parser = tool_parser  # a tool_parsers.ToolParser, or None
        self.groups: dict[str, GroupState] = {}
        self.states: dict[str, RequestState] = {}  # unfinished completions by request id
        self.pooling: dict[str, tuple] = {}  # a pooling model's queued prompts: request id -> (prepared, metrics)

    def add_prompt(self, group_id: str, request_ids: list[str], prepared, eos_token_ids: frozenset,
                   stream: bool = False) -> None:
        """Track a queued prompt (an input/ PreparedPrompt) as its completions `request_ids` (n of them);
        `stream`: its outputs are deltas, one each step it advances (output/stream_delta.py)."""
        params, arrival = prepared.sampling_params, time.time()
        completions = [
            RequestState(
                request_id=request_id, group_id=group_id, index=i, sampling_params=params,
                eos_token_ids=eos_token_ids,
                detokenizer=IncrementalDetokenizer(self.tokenizer, prepared.prompt_token_ids, params.skip_special_tokens),
                metrics=RequestMetrics(arrival_time=arrival),
                logprobs=[] if params.logprobs is not None else None,
                read_tool_calls=self.tool_parser.parse_completion if self.tool_parser is not None else None,
            )
            for i, request_id in enumerate(request_ids)
        ]
        prompt_logprobs = [None] * len(prepared.prompt_token_ids) if params.prompt_logprobs is not None else None
        self.groups[group_id] = GroupState(group_id, prepared.prompt, prepared.prompt_token_ids, completions,
                                           prompt_logprobs,
                                           num_input_image_tokens=prepared.num_placeholder_tokens("image"),
                                           num_input_video_tokens=prepared.num_placeholder_tokens("video"),
                                           stream=stream)
        if stream and self.reasoning_parser is not None:
            prompt_text = self.tokenizer.decode(list(prepared.prompt_token_ids), skip_special_tokens=False)
            for state in completions:
                state.thinking_open = self.reasoning_parser.prompt_opens_thinking(prompt_text)
        for state in completions:
            self.states[state.request_id] = state

    def add_pooling_prompt(self, request_id: str, prepared) -> None:
        """Track a pooling model's queued prompt (a PreparedPrompt with pooling_params): its output comes in
        the step that computes its prompt."""
        self.pooling[request_id] = (prepared, RequestMetrics(arrival_time=time.time()))

    def set_tool_call_reader(self, group_id: str, reader) -> None:
        """How a queued prompt's completions get their tool calls, in place of the tool parser:
        `reader(text, reasoning_content, answer) -> (tool_calls or None, new text)` (the signature
        of tool_parsers' `ToolParser.parse_completion`), or None: no calls, text as is."""
        group = self.groups.get(group_id)
        for state in group.completions if group is not None else ():
            state.read_tool_calls = reader

    def has_unfinished(self) -> bool:
        return bool(self.states or self.pooling)

    def on_scheduled(self, request_id: str, now: float, num_cached_tokens: Optional[int]) -> None:
        """A completion entered a model step for the first time (or again after a preemption)."""
        state = self.states.get(request_id)
        if state is None:
            if request_id in self.pooling:
                self.pooling[request_id][1].inference_start_time = now
            return
        if state.metrics.inference_start_time is None:
            state.metrics.inference_start_time = now
        if state.index == 0 and num_cached_tokens is not None:
            self.groups[state.group_id].num_cached_tokens = num_cached_tokens

    # ---- one step ---------------------------------------------------------------------------------
    def process(self, runner_output: ModelRunnerOutput,
                failed: Optional[dict] = None) -> tuple[list[str], list[RequestOutput]]:
        """Apply a step's tokens: (ids of completions that finished, outputs of prompts now complete).
        `failed` {req_id: error}: completions that cannot go on (their grammar rejected the token);
        each ends with finish_reason "abort" and its error, after its token is appended."""
        for req_id, scores in runner_output.prompt_logprobs.items():
            self._store_prompt_logprobs(req_id, scores)
        finished_ids, outputs = list(runner_output.pooler_output), []
        for req_id, data in runner_output.pooler_output.items():
            entry = self.pooling.pop(req_id, None)
            if entry is not None:  # else aborted meanwhile
                outputs.append(_pooling_output(req_id, *entry, data))
        advanced = {}
        for req_id, token_ids in runner_output.sampled_token_ids.items():
            state = self.states.get(req_id)
            if state is None:  # no completion waits for it (aborted): the scheduler must drop it too
                finished_ids.append(req_id)
                continue
            drafted = runner_output.num_draft_tokens.get(req_id, 0)
            if drafted:
                state.metrics.num_draft_tokens += drafted
                state.metrics.num_accepted_tokens += len(token_ids) - 1
            logprobs = runner_output.logprobs.get(req_id)
            for i, token_id in enumerate(token_ids):  # a stop among accepted drafts drops the rest
                done = self._append(state, token_id, logprobs, i)
                if done:
                    break
            if failed and req_id in failed and not done:
                state.finish_reason, state.error, done = "abort", failed[req_id], True
            if done:
                finished_ids.append(req_id)
                del self.states[req_id]
            advanced[state.group_id] = self.groups[state.group_id]
        for group in advanced.values():
            if group.finished:
                del self.groups[group.request_id]
            if group.stream:
                outputs.append(self._make_output(group, delta=True))
            elif group.finished:
                outputs.append(self._make_output(group))
        return finished_ids, outputs

    def _append(self, state: RequestState, token_id: int, logprobs, row: int) -> bool:
        """Append one token (its logprobs at `row` of the step's arrays); True when the completion ended."""
        try:
            if logprobs is not None:
                state.logprobs.append(logprobs_dict(logprobs, row, token_id, self.token_texts))
                state.cumulative_logprob += float(logprobs.token_logprobs[row])
            done = append_token(state, token_id)
        except Exception as e:  # this completion fails alone; the rest of the batch goes on
            logger.exception("request %s failed while processing its output", state.request_id)
            state.finish_reason, state.error = "abort", f"{type(e).__name__}: {e}"
            done = True
        if len(state.output_token_ids) == 1 and state.metrics.first_token_time is None:
            state.metrics.first_token_time = time.time() - state.metrics.inference_start_time
        return done

    def _store_prompt_logprobs(self, req_id: str, scores) -> None:
        state = self.states.get(req_id)
        if state is None:
            return
        group = self.groups[state.group_id]
        for i, position in enumerate(scores.positions.tolist()):
            token_id = group.prompt_token_ids[position]
            group.prompt_logprobs[position] = logprobs_dict(scores.logprobs, i, token_id, self.token_texts)

    def abort(self, group_id: str) -> tuple[list[str], Optional[RequestOutput]]:
        """Stop a prompt's unfinished completions: (the ids of all its completions, for the scheduler
        to drop; the prompt's output with finish_reason "abort" on the unfinished ones), or
        ([], None) for an unknown or finished prompt (a pooling prompt: ([its id], None))."""
        if self.pooling.pop(group_id, None) is not None:
            return [group_id], None
        group = self.groups.pop(group_id, None)
        if group is None:
            return [], None
        aborted = [c.request_id for c in group.completions]
        for state in group.completions:
            if not state.finished:
                state.finish_reason = "abort"
            self.states.pop(state.request_id, None)
        return aborted, self._make_output(group, delta=group.stream)

    # ---- RequestOutput ------------------------------------------------------------------------------
    def _make_output(self, group: GroupState, delta: bool = False) -> RequestOutput:
        """The prompt's RequestOutput once all its completions have finished; with `delta` (a streamed
        prompt) what each completion added since the last delta (output/stream_delta.py), every step."""
        errors = [c.error for c in group.completions if c.error is not None]
        prompt_logprobs = group.prompt_logprobs
        if delta:
            completions = [take_delta(c, self._completion(c, group.prompt_token_ids)) for c in group.completions
                           if has_news(c)]
            if group.prompt_logprobs_sent:  # the prompt's logprobs come once, on the first delta
                prompt_logprobs = None
            group.prompt_logprobs_sent = True
        else:
            completions = [self._completion(c, group.prompt_token_ids) for c in group.completions]
        return RequestOutput(
            request_id=group.request_id,
            prompt=group.prompt,
            prompt_token_ids=list(group.prompt_token_ids),
            prompt_logprobs=prompt_logprobs,
            outputs=CompletionOutputs(completions),
            finished=group.finished,
            metrics=_metrics(group),
            num_cached_tokens=group.num_cached_tokens,
            num_input_image_tokens=group.num_input_image_tokens,
            num_input_video_tokens=group.num_input_video_tokens,
            error_code=200 if not errors else 500,
            error_msg=errors[0] if errors else None,
        )

    def _completion(self, state: RequestState, prompt_token_ids: list[int]) -> CompletionOutput:
        """The completion as it stands; a running one split for streaming, without the text it holds
        back (stream_delta.py)."""
        wants_logprobs = state.logprobs is not None
        full = reasoning_text = state.detokenizer.text
        reasoning, tool_calls = None, None
        if self.reasoning_parser is not None:
            reasoning, reasoning_text = self.reasoning_parser.extract_from_tokens(  # tags may be special tokens
                full, state.output_token_ids, self.tokenizer, state.sampling_params.skip_special_tokens,
                prompt_token_ids)
            if reasoning is None and (not state.finished or streamed_as_reasoning(state)):
                provisional = self.reasoning_parser.split_unfinished(full, state.thinking_open)
                if provisional is not None:
                    reasoning, reasoning_text = provisional
        text = reasoning_text
        if not state.finished:
            text = visible_answer(text, state)
        elif state.read_tool_calls is not None:
            tool_calls, text = state.read_tool_calls(full, reasoning, reasoning_text)
        return CompletionOutput(
            index=state.index,
            send_idx=len(state.output_token_ids),
            token_ids=list(state.output_token_ids),
            text=text,
            reasoning_content=reasoning,
            tool_calls=tool_calls,
            finish_reason=state.finish_reason,
            stop_reason=state.stop_reason,
            cumulative_logprob=state.cumulative_logprob if wants_logprobs else None,
            logprobs=state.logprobs,
        )


def _pooling_output(request_id: str, prepared, metrics: RequestMetrics, data) -> PoolingRequestOutput:
    """The task's PoolingRequestOutput (engine/pooling_output.py) of a pooled prompt."""
    request_cls, outputs_cls = OUTPUT_CLASSES[prepared.pooling_params.task]
    now = time.time()
    metrics.model_execute_time = now - metrics.arrival_time
    if metrics.inference_start_time is not None:
        metrics.time_in_queue = metrics.inference_start_time - metrics.arrival_time
        metrics.model_forward_time = metrics.first_token_time = now - metrics.inference_start_time
    return request_cls(request_id=request_id, prompt=prepared.prompt, prompt_token_ids=list(prepared.prompt_token_ids),
                       outputs=outputs_cls(data), metrics=metrics)


def _metrics(group: GroupState) -> RequestMetrics:
    """The prompt's timings: from its arrival and its earliest-started completion to now."""
    now = time.time()
    completions = [c.metrics for c in group.completions]
    m = RequestMetrics(arrival_time=completions[0].arrival_time)
    starts = [c.inference_start_time for c in completions if c.inference_start_time is not None]
    if starts:
        m.inference_start_time = min(starts)
        m.time_in_queue = m.inference_start_time - m.arrival_time
        m.model_forward_time = now - m.inference_start_time
        firsts = [c.inference_start_time + c.first_token_time for c in completions if c.first_token_time is not None]
        if firsts:
            m.first_token_time = min(firsts) - m.inference_start_time
    m.model_execute_time = now - m.arrival_time
    m.num_draft_tokens = sum(c.num_draft_tokens for c in completions)
    m.num_accepted_tokens = sum(c.num_accepted_tokens for c in completions)
    return m
