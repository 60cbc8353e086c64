"""The OpenAI batch file format: one request line in, one output line out. Pure data, no engine.

Formats from OpenAI's Batch API docs (platform.openai.com/docs/guides/batch, "input file" and
"output file"); the sampling extras and `chat_template_kwargs` follow vLLM's `run_batch`.

Input line (one JSON object per line)::

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 16}}
    {"custom_id": "q2", "url": "/v1/completions", "body": {"prompt": "Once upon a time", "max_tokens": 8}}

The accepted keys, how they map to SamplingParams, the output shapes and the error codes are
listed in docs/batch_format.md. In short: chat bodies need `messages`, completion bodies one
`prompt` (a str or token ids; several prompts in one request are rejected); OpenAI's and vLLM's
sampling keys map to SamplingParams; the output-control keys (response_format, guided_*,
structured_outputs, logit_bias, tools...) are mapped by constraints.py; `model`, `user`, `stream` (false only) and `stream_options`
are accepted and ignored (`model` is echoed); any other key is rejected, naming it.

Output line of a success (`response_record`)::

    {"id": "batch_req_<hex>", "custom_id": "q1", "error": null,
     "response": {"status_code": 200, "request_id": "<engine id>", "body": {
        "id": "chatcmpl-<hex>", "object": "chat.completion", "created": 1700000000, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"},
                     "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}}}

and of a failure (`error_record`)::

    {"id": "batch_req_<hex>", "custom_id": "q1", "response": null,
     "error": {"code": "invalid_json", "message": "...", "line": 3, "status_code": 400}}
"""
from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Optional, Union

from fastdeploy.engine.request import RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.batch import constraints
from fastdeploy.entrypoints.chat_utils import validate_conversation

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
URLS = {CHAT_URL: "chat", COMPLETIONS_URL: "completion"}
LINE_KEYS = ("custom_id", "method", "url", "body")

# error codes of BatchLineError / error_record
INVALID_JSON = "invalid_json"  # not JSON (or NaN / Infinity)
INVALID_REQUEST = "invalid_request"  # JSON, but not a request line: shape, custom_id, body, messages, prompt
UNSUPPORTED_METHOD = "unsupported_method"
UNSUPPORTED_URL = "unsupported_url"
UNKNOWN_PARAMETER = "unknown_parameter"  # a body key this server does not know
INVALID_PARAMETER = "invalid_parameter"  # a known body key with a bad value (SamplingParams' checks)
INTERNAL_ERROR = "internal_error"  # the request failed while running (status 500)

SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
                 "frequency_penalty", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
                 "stop_token_ids", "skip_special_tokens", "include_stop_str_in_output", "bad_words")
IGNORED_KEYS = ("model", "user", "stream", "stream_options")
OUTPUT_KEYS = (*constraints.STRUCTURED_KEYS, *constraints.LOGITS_KEYS)  # constraints.py maps them
CHAT_KEYS = ("messages", "max_completion_tokens", "logprobs", "top_logprobs", "chat_template_kwargs",
             *SAMPLING_KEYS, *OUTPUT_KEYS, *constraints.TOOL_KEYS, *IGNORED_KEYS)
COMPLETION_KEYS = ("prompt", "logprobs", *SAMPLING_KEYS, *OUTPUT_KEYS, *IGNORED_KEYS)
LOGPROB_FLOOR = -9999.0  # -inf is not JSON: logprobs are reported as at least this (vLLM does the same)


@dataclass
class BatchRequest:
    """One parsed input line, ready for `LLM.chat` (kind "chat") or `LLM.generate` ("completion")."""

    custom_id: str
    line: int  # 1-based line number in the input file
    kind: str  # "chat" or "completion"
    messages: Optional[list]  # chat: the OpenAI messages, validated
    prompt: Union[str, list[int], None]  # completion: text or token ids
    sampling_params: SamplingParams
    chat_template_kwargs: Optional[dict]  # chat only: body["chat_template_kwargs"]
    model: Optional[str]  # body["model"], echoed in the response; None: the runner's model name
    tools: Optional[list] = None  # chat only: the validated tools, rendered by the chat template
    tool_choice: Union[str, dict, None] = None  # chat only: None, "auto", "none", "required" or a function
    guided_decoding_backend: Optional[str] = None  # the body's; the worker accepts only its LLM's
    constraint_key: Optional[str] = None  # the body key the output constraint came from ("tool_choice" too)


class BatchLineError(ValueError):
    """A line that cannot become a request.

    Attributes: line (1-based), custom_id (None when unknown), code (short str, one of the
    module's error-code constants), message (what is wrong, naming the key)."""

    def __init__(self, line: int, custom_id: Optional[str], code: str, message: str):
        super().__init__(f"line {line}" + (f" (custom_id {custom_id!r})" if custom_id is not None else "")
                         + f": {code}: {message}")
        self.line, self.custom_id, self.code, self.message = line, custom_id, code, message


def parse_request_line(text: str, line: int) -> BatchRequest:
    """Parse one input line (a str, or UTF-8 bytes) into a BatchRequest.

    Raises BatchLineError, and nothing else, for any input. Example::

        >>> r = parse_request_line('{"custom_id": "a", "url": "/v1/completions", '
        ...                        '"body": {"prompt": "Hi", "max_tokens": 4}}', 1)
        >>> r.kind, r.prompt, r.sampling_params.max_tokens
        ('completion', 'Hi', 4)
    """
    custom_id = None
    try:
        obj = _load_json(text, line)
        if not isinstance(obj, dict):
            raise _error(line, None, INVALID_REQUEST, f"a line must be a JSON object, got {_kind(obj)}")
        custom_id = obj.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            raise _error(line, None, INVALID_REQUEST, f"custom_id must be a non-empty string, got {custom_id!r}")
        return _parse_object(obj, line, custom_id)
    except BatchLineError:
        raise
    except Exception as e:  # a safety net: the checks above are meant to leave nothing for it
        raise _error(line, custom_id, INVALID_REQUEST, f"{type(e).__name__}: {e}") from e


def _error(line, custom_id, code, message) -> BatchLineError:
    return BatchLineError(line, custom_id, code, message)


def _kind(value) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def _load_json(text, line: int):
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _error(line, None, INVALID_JSON, f"not UTF-8: {e}") from e
    if not isinstance(text, str):
        raise _error(line, None, INVALID_JSON, f"a line must be text, got {type(text).__name__}")
    text = text.lstrip("\ufeff").strip()
    if not text:
        raise _error(line, None, INVALID_JSON, "empty line")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, NaN/Infinity, huge ints, deep nesting
        raise _error(line, None, INVALID_JSON, f"not valid JSON: {e}") from e


def _parse_object(obj: dict, line: int, cid: str) -> BatchRequest:
    unknown = sorted(set(obj) - set(LINE_KEYS))
    if unknown:
        raise _error(line, cid, INVALID_REQUEST, f"unknown key(s) {unknown} in the line; accepted: {list(LINE_KEYS)}")
    method = obj.get("method", "POST")
    if not isinstance(method, str) or method.upper() != "POST":
        raise _error(line, cid, UNSUPPORTED_METHOD, f"method must be POST, got {method!r}")
    url = obj.get("url")
    if url not in URLS:
        raise _error(line, cid, UNSUPPORTED_URL, f"url must be one of {list(URLS)}, got {url!r}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise _error(line, cid, INVALID_REQUEST, f"body must be an object, got {_kind(body)}")
    kind = URLS[url]
    accepted = CHAT_KEYS if kind == "chat" else COMPLETION_KEYS
    unknown = sorted(set(body) - set(accepted))
    if unknown:
        raise _error(line, cid, UNKNOWN_PARAMETER,
                     f"unknown key(s) {unknown} in the body of {url}; accepted: {sorted(accepted)}")
    body = {k: v for k, v in body.items() if v is not None}  # null = absent
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _error(line, cid, INVALID_PARAMETER, f"model must be a string, got {model!r}")
    if body.get("stream", False) is not False:
        raise _error(line, cid, INVALID_PARAMETER, f"stream is not supported in batch (got {body['stream']!r})")
    messages = prompt = template_kwargs = None
    if kind == "chat":
        messages = _chat_messages(body, line, cid)
        template_kwargs = body.get("chat_template_kwargs")
        if template_kwargs is not None and not isinstance(template_kwargs, dict):
            raise _error(line, cid, INVALID_PARAMETER, f"chat_template_kwargs must be an object, got {_kind(template_kwargs)}")
    else:
        prompt = _completion_prompt(body, line, cid)
    params, constraint_key = _sampling_params(body, kind, line, cid)
    request = BatchRequest(cid, line, kind, messages, prompt, params, template_kwargs, model,
                           constraint_key=constraint_key)
    try:
        if "guided_decoding_backend" in body:
            request.guided_decoding_backend = constraints.backend_name(body["guided_decoding_backend"])
        if kind == "chat":
            _add_tools(request, body)
    except (ValueError, TypeError) as e:  # the messages name the key (tools[i], tool_choice, ...)
        raise _error(line, cid, INVALID_PARAMETER, str(e)) from e
    return request


def _add_tools(request: BatchRequest, body: dict) -> None:
    """The body's tools and tool_choice on `request`; a forcing tool_choice constrains its output."""
    request.tools, request.tool_choice = constraints.tools_and_choice(body)
    forced = constraints.forced_call_params(request.sampling_params, request.tools, request.tool_choice,
                                            request.constraint_key)
    if forced is not request.sampling_params:
        request.sampling_params, request.constraint_key = forced, "tool_choice"


def _chat_messages(body: dict, line: int, cid: str) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _error(line, cid, INVALID_REQUEST, f"messages must be a non-empty array of message objects, got {messages!r}")
    try:
        validate_conversation(messages, 0, multimodal=True)  # a text model refuses media parts when it renders
    except (ValueError, TypeError) as e:
        raise _error(line, cid, INVALID_REQUEST, "messages: " + str(e).replace("conversation 0, ", "", 1)) from e
    return messages


def _is_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def _completion_prompt(body: dict, line: int, cid: str) -> Union[str, list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > 1:
            raise _error(line, cid, INVALID_REQUEST,
                         f"only one prompt per request: got {len(prompt)} prompts; put each on its own line")
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt):
        return list(prompt)
    raise _error(line, cid, INVALID_REQUEST,
                 f"prompt must be a non-empty string or a non-empty array of token ids (ints >= 0), got {prompt!r}")


def _sampling_params(body: dict, kind: str, line: int, cid: str) -> tuple[SamplingParams, Optional[str]]:
    """(the SamplingParams, the body key its guided_decoding came from or None)."""
    kwargs = {k: body[k] for k in SAMPLING_KEYS if k in body}
    if "max_completion_tokens" in body:
        if "max_tokens" in kwargs and kwargs["max_tokens"] != body["max_completion_tokens"]:
            raise _error(line, cid, INVALID_PARAMETER,
                         f"max_tokens={kwargs['max_tokens']!r} and max_completion_tokens="
                         f"{body['max_completion_tokens']!r} differ: give one (max_completion_tokens is the newer name)")
        value = body["max_completion_tokens"]
        if not _is_id(value) or value < 1:
            raise _error(line, cid, INVALID_PARAMETER, f"max_completion_tokens must be an int >= 1, got {value!r}")
        kwargs["max_tokens"] = value
    logprobs = body.get("logprobs")
    if kind == "chat":
        top = body.get("top_logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise _error(line, cid, INVALID_PARAMETER, f"logprobs must be true or false for chat, got {logprobs!r}")
        if top is not None and logprobs is not True:
            raise _error(line, cid, INVALID_PARAMETER, "top_logprobs needs logprobs=true")
        if top is not None and not _is_id(top):
            raise _error(line, cid, INVALID_PARAMETER, f"top_logprobs must be an int >= 0, got {top!r}")
        if logprobs:
            kwargs["logprobs"] = top or 0
    elif logprobs is not None:
        if not _is_id(logprobs):
            raise _error(line, cid, INVALID_PARAMETER, f"logprobs must be an int >= 0 for completions, got {logprobs!r}")
        kwargs["logprobs"] = logprobs
    try:
        kwargs["guided_decoding"], constraint_key = constraints.guided_decoding(body)
        if "logit_bias" in body:
            kwargs["logit_bias"] = constraints.logit_bias(body["logit_bias"])
        kwargs.update({k: body[k] for k in ("allowed_token_ids", "logits_processors_args") if k in body})
        return SamplingParams(**kwargs), constraint_key
    except (ValueError, TypeError) as e:  # the messages (SamplingParams', constraints.py's) name the key
        raise _error(line, cid, INVALID_PARAMETER, str(e)) from e


# ---- output lines ------------------------------------------------------------------------------
def error_record(custom_id: Optional[str], line: int, code: str, message: str, status_code: int = 400) -> dict:
    """The output line of a request that failed: no response, an error object.

    >>> error_record("q1", 3, "invalid_json", "not valid JSON")["error"]["line"]
    3
    """
    return {"id": _batch_id(), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message, "line": line, "status_code": status_code}}


def response_record(request: BatchRequest, output: RequestOutput, model_name: str) -> dict:
    """The output line of a finished request: status 200 and an OpenAI chat.completion (kind "chat")
    or text_completion object as the body. The body's `model` is `request.model` when the line gave
    one, else `model_name`. A RequestOutput that failed at run time (error_code != 200) gives
    `error_record(custom_id, line, "internal_error", error_msg, 500)` instead."""
    if output.error_code != 200:
        message = output.error_msg or f"the request failed (error_code {output.error_code})"
        return error_record(request.custom_id, request.line, INTERNAL_ERROR, message, 500)
    chat = request.kind == "chat"
    choices = [_chat_choice(c, request) if chat else _completion_choice(c) for c in output.outputs]
    completion_tokens = sum(len(c.token_ids) for c in output.outputs)
    prompt_tokens = len(output.prompt_token_ids)
    body = {
        "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": request.model if request.model is not None else model_name,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }
    return {"id": _batch_id(), "custom_id": request.custom_id, "error": None,
            "response": {"status_code": 200, "request_id": output.request_id, "body": body}}


def _batch_id() -> str:
    return "batch_req_" + uuid.uuid4().hex


def _chat_choice(c, request: BatchRequest) -> dict:
    """OpenAI's chat choice. With tool calls: `message.tool_calls`, `content` None when nothing
    else was said, and finish_reason "tool_calls" where the completion stopped by itself."""
    message = {"role": "assistant", "content": c.text if c.text or not c.tool_calls else None}
    if c.reasoning_content is not None:
        message["reasoning_content"] = c.reasoning_content  # vLLM's field
    finish_reason = c.finish_reason
    if c.tool_calls:
        message["tool_calls"] = [call.to_dict() for call in c.tool_calls]
        finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
    logprobs = None
    if c.logprobs is not None:
        k = request.sampling_params.logprobs
        logprobs = {"content": [_chat_token(d, t, k) for d, t in zip(c.logprobs, c.token_ids)]}
    return {"index": c.index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}


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


def _completion_choice(c) -> dict:
    logprobs = None
    if c.logprobs is not None:
        tokens, token_logprobs, top_logprobs, offsets, offset = [], [], [], [], 0
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
        logprobs = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                    "text_offset": offsets}
    return {"index": c.index, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason}
