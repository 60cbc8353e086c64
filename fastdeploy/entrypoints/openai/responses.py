"""OpenAI response bodies and stream chunks from RequestOutputs (and PoolingRequestOutputs). Pure data, no engine.

Shapes from OpenAI's API reference (the chat completion object, the chat completion chunk object,
the completion object), as the official `openai` client parses them; `reasoning_content` and
`prompt_logprobs` are vLLM's fields.

- `chat_completion_body(output, params, model)` / `completion_body(outputs, params, model)`: a
  finished request's `chat.completion` / `text_completion` object.
- `pooling_body(request, outputs, plan)`: a finished /v1/embeddings request's `list` of
  `embedding` objects (OpenAI's; base64 is the little-endian float32 bytes, as the `openai` client
  decodes them) or a /v1/score request's `list` of `score` objects (vLLM's), in input order.
- `ChatStream(request)` / `CompletionStream(request)`: one streamed response. `feed(delta)` takes a
  delta RequestOutput (only the completions that changed; each CompletionOutput's `token_ids`,
  `text`, `reasoning_content` and `logprobs` hold only what is new, `finish_reason` and
  `tool_calls` come on its last delta) and returns the chunks to send, one choice each;
  `finish()` returns the closing usage chunk when `include_usage` asked for one. Every chunk of a
  response has the same `id` and `created`.
- `sse(chunk)` and `SSE_DONE`: the server-sent-events lines.

Choices are indexed globally: completion j of prompt i is choice i * n + j (OpenAI's and vLLM's
rule for several prompts). Logprob shapes: chat `{"content": [{"token", "logprob", "bytes",
"top_logprobs": [k entries]}]}`; completions `{"tokens", "token_logprobs", "top_logprobs": [{token:
logprob}] (k or k + 1 entries: the k most likely and the generated token), "text_offset"}`, the
offsets counting characters of the token texts from the start of the choice (running across
chunks). A token's text is `Logprob.decoded_token`; -inf and NaN logprobs are written as -9999.0.
"""
from __future__ import annotations

import base64
import json
import math
import time
import uuid
from typing import Optional

import numpy as np

from fastdeploy.engine.request import CompletionOutput, RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.openai.protocol import OpenAIError, OpenAIRequest, PoolingRequest
from fastdeploy.entrypoints.scoring import ScorePlan

LOGPROB_FLOOR = -9999.0  # -inf is not JSON: logprobs are reported as at least this (vLLM does the same)
SSE_DONE = "data: [DONE]\n\n"


def sse(chunk: dict) -> str:
    """One server-sent event: `data: {json}\\n\\n` (UTF-8 text kept as it is)."""
    return f"data: {json.dumps(chunk, ensure_ascii=False, allow_nan=False)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: Optional[int] = None) -> dict:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens` when `cached_tokens` is given."""
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


# ---- finished responses ------------------------------------------------------------------------------
def chat_completion_body(output: RequestOutput, params: SamplingParams, model: str,
                         prompt_tokens_details: bool = True) -> dict:
    """OpenAI's `chat.completion` object of a finished request (`params`: its SamplingParams, for
    `n` and the top_logprobs count). `prompt_tokens_details=False` leaves the cached-token count
    out of the usage. OpenAIError (500) when the request failed at run time."""
    _check(output)
    body = _body("chat", model, [chat_choice(c, c.index, params.logprobs) for c in output.outputs],
                 _usage_of([output], prompt_tokens_details))
    if output.prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs(output.prompt_logprobs)
    return body


def completion_body(outputs: list[RequestOutput], params: SamplingParams, model: str,
                    prompt_tokens_details: bool = True) -> dict:
    """OpenAI's `text_completion` object of finished requests, one RequestOutput per prompt in
    prompt order; choice i * n + j is completion j of prompt i. OpenAIError (500) when one failed."""
    choices = []
    for i, output in enumerate(outputs):
        _check(output)
        for c in output.outputs:
            choice = completion_choice(c, i * params.n + c.index)
            if output.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs(output.prompt_logprobs)
            choices.append(choice)
    return _body("completion", model, choices, _usage_of(outputs, prompt_tokens_details))


def pooling_body(request: PoolingRequest, outputs: list, plan: Optional[ScorePlan]) -> dict:
    """The body of a finished embedding or score request: `outputs` are its PoolingRequestOutputs in
    request order (prepare.prepare_pooling's), `plan` the score request's ScorePlan. `usage` counts
    the prompt tokens the model read (an embedding model's score: each distinct text once).
    OpenAIError (500) when one failed at run time."""
    for output in outputs:
        _check(output)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    usage_ = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    if plan is None:
        data = [{"object": "embedding", "index": i, "embedding": _embedding(o.outputs.data, request.encoding_format)}
                for i, o in enumerate(outputs)]
        return {"object": "list", "data": data, "model": request.model, "usage": usage_}
    data = [{"index": i, "object": "score", "score": o.outputs.score} for i, o in enumerate(plan.scores(outputs))]
    return {"id": "score-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()), "model": request.model,
            "data": data, "usage": usage_}


def _embedding(data: np.ndarray, encoding_format: str):
    """A float32 vector as a list of numbers, or base64 of its little-endian bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(data, dtype="<f4").tobytes()).decode("ascii")
    return data.tolist()


def chat_choice(c: CompletionOutput, index: int, top_logprobs: Optional[int]) -> dict:
    """OpenAI's chat choice. With tool calls: `message.tool_calls`, `content` None when nothing
    else was said, and finish_reason "tool_calls" where the completion stopped by itself."""
    message = {"role": "assistant", "content": c.text if c.text or not c.tool_calls else None}
    if c.reasoning_content is not None:
        message["reasoning_content"] = c.reasoning_content  # vLLM's field
    if c.tool_calls:
        message["tool_calls"] = [call.to_dict() for call in c.tool_calls]
    return {"index": index, "message": message, "logprobs": _chat_logprobs(c, top_logprobs),
            "finish_reason": _finish_reason(c)}


def completion_choice(c: CompletionOutput, index: int) -> dict:
    """OpenAI's completion choice (text, logprobs with text_offset from 0, finish_reason)."""
    return {"index": index, "text": c.text, "logprobs": _completion_logprobs(c, 0)[0], "finish_reason": c.finish_reason}


def prompt_logprobs(per_token: list) -> list:
    """vLLM's `prompt_logprobs`: per prompt token None (the first) or {"token id": {"logprob",
    "rank", "decoded_token"}}."""
    return [None if d is None else {str(t): {"logprob": _logprob(lp), "rank": lp.rank,
                                             "decoded_token": lp.decoded_token} for t, lp in d.items()}
            for d in per_token]


def _check(output: RequestOutput) -> None:
    if output.error_code != 200:
        raise OpenAIError(500, output.error_msg or f"the request failed (error_code {output.error_code})",
                          type="internal_server_error", code="internal_error")


def _body(kind: str, model: str, choices: list, usage_: dict) -> dict:
    chat = kind == "chat"
    return {"id": _response_id(kind), "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices, "usage": usage_}


def _response_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def _usage_of(outputs: list[RequestOutput], details: bool) -> dict:
    completion_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outputs) if details else None
    return usage(sum(len(o.prompt_token_ids) for o in outputs), completion_tokens, cached)


def _finish_reason(c: CompletionOutput) -> Optional[str]:
    return "tool_calls" if c.tool_calls and c.finish_reason == "stop" else c.finish_reason


# ---- logprobs ------------------------------------------------------------------------------------------
def _token_text(token_id: int, lp) -> str:
    return lp.decoded_token if lp.decoded_token is not None else f"token_id:{token_id}"


def _logprob(lp) -> float:
    value = float(lp.logprob)
    return LOGPROB_FLOOR if math.isnan(value) else max(value, LOGPROB_FLOOR)


def _entry(token_id: int, lp) -> dict:
    token = _token_text(token_id, lp)
    return {"token": token, "logprob": _logprob(lp), "bytes": list(token.encode("utf-8", "replace"))}


def _by_rank(d: dict) -> list:
    return sorted(d.items(), key=lambda item: (item[1].rank, -item[1].logprob))


def _chat_token(d: dict, token_id: int, k: Optional[int]) -> dict:
    """OpenAI's chat entry: the generated token, and top_logprobs = the k most likely tokens (the
    engine's dict holds them plus the generated one when that one is outside the top k)."""
    top = _by_rank(d)
    if k is not None and len(d) > k:
        top = [(t, lp) for t, lp in top if t != token_id][:k]
    return {**_entry(token_id, d[token_id]), "top_logprobs": [_entry(t, lp) for t, lp in top]}


def _chat_logprobs(c: CompletionOutput, k: Optional[int]) -> Optional[dict]:
    if c.logprobs is None:
        return None
    return {"content": [_chat_token(d, t, k) for d, t in zip(c.logprobs, c.token_ids)]}


def _completion_logprobs(c: CompletionOutput, offset: int) -> tuple[Optional[dict], int]:
    """(OpenAI's completion logprobs of `c`'s tokens, their text offsets starting at `offset`; the
    offset after them)."""
    if c.logprobs is None:
        return None, offset
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for d, t in zip(c.logprobs, c.token_ids):
        token = _token_text(t, d[t])
        tokens.append(token)
        token_logprobs.append(_logprob(d[t]))
        top = {}
        for tid, lp in _by_rank(d):  # OpenAI: the k most likely and the sampled token (k or k + 1)
            top.setdefault(_token_text(tid, lp), _logprob(lp))
        top_logprobs.append(top)
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": offsets}, offset


# ---- streams -------------------------------------------------------------------------------------------
class _Stream:
    """What both streams keep: the response's id and created time, and the usage so far."""

    kind = ""
    object = ""

    def __init__(self, request: OpenAIRequest):
        self.request = request
        self.n = request.sampling_params.n
        self.id = _response_id(self.kind)
        self.created = int(time.time())
        self.prompt_tokens: dict[int, int] = {}  # prompt index -> its tokens
        self.cached_tokens: dict[int, int] = {}
        self.completion_tokens = 0
        self.finished: set[int] = set()  # choice indices

    def feed(self, delta: RequestOutput, prompt_index: int = 0) -> list[dict]:
        """The chunks of one delta RequestOutput of prompt `prompt_index` (0 for chat): one per
        completion that has something to say (new text, reasoning, logprobs or tool calls, its
        finish), after the opening chunks of a prompt's first delta. A second finish_reason for
        one choice is a ValueError (the engine's delta contract broken)."""
        chunks = []
        if prompt_index not in self.prompt_tokens:
            self.prompt_tokens[prompt_index] = len(delta.prompt_token_ids)
            chunks += self._opening(prompt_index, delta.prompt_logprobs)
        self.cached_tokens[prompt_index] = delta.num_cached_tokens
        for c in delta.outputs:
            self.completion_tokens += len(c.token_ids)
            index = prompt_index * self.n + c.index
            if c.finish_reason is not None:
                if index in self.finished:
                    raise ValueError(f"choice {index} finished twice (finish_reason {c.finish_reason!r})")
                self.finished.add(index)
            choice = self._choice(c, index)
            if choice is not None:
                chunks.append(self._chunk([choice]))
        return chunks

    def finish(self) -> list[dict]:
        """The closing chunks: with include_usage, one with `choices: []` and the whole usage."""
        return [self._chunk([], self.usage())] if self.request.include_usage else []

    def usage(self) -> dict:
        """The usage so far: every prompt's tokens once, every completion's tokens, the cached ones."""
        return usage(sum(self.prompt_tokens.values()), self.completion_tokens, sum(self.cached_tokens.values()))

    def _chunk(self, choices: list, usage_: Optional[dict] = None) -> dict:
        if usage_ is None and self.request.continuous_usage_stats:
            usage_ = self.usage()
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.request.model,
                "choices": choices, "usage": usage_}

    def _opening(self, prompt_index: int, prompt_logprobs_: Optional[list]) -> list[dict]:
        """The chunks sent before a prompt's first completion chunk."""
        raise NotImplementedError

    def _choice(self, c: CompletionOutput, index: int) -> Optional[dict]:
        """The chunk's choice for delta `c` (choice `index`), or None when it says nothing."""
        raise NotImplementedError


class ChatStream(_Stream):
    """The `chat.completion.chunk`s of one streamed chat response. It opens with one chunk per
    choice, in index order, holding `delta: {"role": "assistant", "content": ""}` (OpenAI's first
    chunk; the client's accumulator needs the choices in order and no logprobs there) and
    `prompt_logprobs` at the top level of the first when asked for. Then `delta.content` the new
    text, `delta.reasoning_content` new reasoning, and the last `delta.tool_calls` ([{index, id,
    type, function: {name, arguments}}], whole) with finish_reason "tool_calls" where the
    completion stopped by itself."""

    kind = "chat"
    object = "chat.completion.chunk"

    def _opening(self, prompt_index: int, prompt_logprobs_: Optional[list]) -> list[dict]:
        chunks = [self._chunk([{"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}]) for j in range(self.n)]
        if prompt_logprobs_ is not None:
            chunks[0]["prompt_logprobs"] = prompt_logprobs(prompt_logprobs_)  # as in the body: once, at the top
        return chunks

    def _choice(self, c: CompletionOutput, index: int) -> Optional[dict]:
        delta = {"content": c.text} if c.text else {}
        if c.reasoning_content:
            delta["reasoning_content"] = c.reasoning_content
        if c.tool_calls:
            delta["tool_calls"] = [{"index": i, **call.to_dict()} for i, call in enumerate(c.tool_calls)]
        logprobs = _chat_logprobs(c, self.request.sampling_params.logprobs)
        if not delta and not (logprobs and logprobs["content"]) and c.finish_reason is None:
            return None
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": _finish_reason(c)}


class CompletionStream(_Stream):
    """The `text_completion` chunks of one streamed completion response: `text` the new text,
    `logprobs` with `text_offset` running across the choice's chunks; a choice's first chunk
    carries the prompt's `prompt_logprobs` when asked for (as each choice of the body does)."""

    kind = "completion"
    object = "text_completion"

    def __init__(self, request: OpenAIRequest):
        super().__init__(request)
        self.offsets: dict[int, int] = {}  # choice index -> characters of its token texts so far
        self.prompt_logprobs: dict[int, list] = {}  # prompt index -> vLLM's prompt_logprobs, until sent

    def _opening(self, prompt_index: int, prompt_logprobs_: Optional[list]) -> list[dict]:
        if prompt_logprobs_ is not None:
            logprobs = prompt_logprobs(prompt_logprobs_)
            self.prompt_logprobs.update({prompt_index * self.n + j: logprobs for j in range(self.n)})
        return []

    def _choice(self, c: CompletionOutput, index: int) -> Optional[dict]:
        logprobs, self.offsets[index] = _completion_logprobs(c, self.offsets.get(index, 0))
        if not (c.text or (logprobs and logprobs["tokens"]) or c.finish_reason is not None):
            return None
        choice = {"index": index, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason}
        if index in self.prompt_logprobs:
            choice["prompt_logprobs"] = self.prompt_logprobs.pop(index)
        return choice
