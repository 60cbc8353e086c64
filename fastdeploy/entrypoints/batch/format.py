"""The OpenAI batch file format: one request line in, one output line out. Pure data, no engine.

Formats from OpenAI's Batch API docs (platform.openai.com/docs/guides/batch, "input file" and
"output file"); the sampling extras and `chat_template_kwargs` follow vLLM's `run_batch`.

Input line (one JSON object per line)::

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 16}}
    {"custom_id": "q2", "url": "/v1/completions", "body": {"prompt": "Once upon a time", "max_tokens": 8}}
    {"custom_id": "e1", "url": "/v1/embeddings", "body": {"input": ["first text", "second text"]}}
    {"custom_id": "s1", "url": "/v1/score", "body": {"text_1": "a query", "text_2": ["doc 1", "doc 2"]}}

The accepted keys, how they map to SamplingParams, the output shapes and the error codes are
listed in docs/batch_format.md. The body is parsed by the server's parser
(entrypoints/openai/protocol.py `parse_body`: messages, prompt, SamplingParams, output keys,
tools) under batch's rules: one prompt per request, `stream` false only, `stream_options`
ignored; any other key is rejected, naming it. Embedding and score bodies are parsed by
`protocol.parse_pooling_body` (one line may hold several inputs: its body has them all, as the
server's does). The response bodies are the server's (entrypoints/openai/responses.py).

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

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import Optional, Union

from fastdeploy.engine.request import RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.openai import protocol, responses
from fastdeploy.entrypoints.openai.protocol import INVALID_PARAMETER, INVALID_REQUEST, UNKNOWN_PARAMETER  # noqa: F401

CHAT_URL = protocol.CHAT_URL
COMPLETIONS_URL = protocol.COMPLETIONS_URL
URLS = {url: kind for kind, url in protocol.URLS.items()}  # chat, completion, embedding, score
POOLING_KINDS = ("embedding", "score")
LINE_KEYS = ("custom_id", "method", "url", "body")

# error codes of BatchLineError / error_record; INVALID_REQUEST (JSON, but not a request line: shape,
# custom_id, body, messages, prompt), UNKNOWN_PARAMETER and INVALID_PARAMETER are the parser's
INVALID_JSON = "invalid_json"  # not JSON (or NaN / Infinity)
UNSUPPORTED_METHOD = "unsupported_method"
UNSUPPORTED_URL = "unsupported_url"
INTERNAL_ERROR = "internal_error"  # the request failed while running (status 500)

STREAM_KEYS = ("stream", "stream_options")  # stream false only; stream_options ignored
CHAT_KEYS = (*protocol.CHAT_KEYS, *STREAM_KEYS)
COMPLETION_KEYS = (*protocol.COMPLETION_KEYS, *STREAM_KEYS)


@dataclass
class BatchRequest:
    """One parsed input line, ready for `LLM.chat` (kind "chat") or `LLM.generate` ("completion")."""

    custom_id: str
    line: int  # 1-based line number in the input file
    kind: str  # "chat", "completion", "embedding" or "score"
    messages: Optional[list]  # chat: the OpenAI messages, validated
    prompt: Union[str, list[int], None]  # completion: text or token ids
    sampling_params: Optional[SamplingParams]  # None for embedding and score
    chat_template_kwargs: Optional[dict]  # chat only: body["chat_template_kwargs"]
    model: Optional[str]  # body["model"], echoed in the response; None: the runner's model name
    tools: Optional[list] = None  # chat only: the validated tools, rendered by the chat template
    tool_choice: Union[str, dict, None] = None  # chat only: None, "auto", "none", "required" or a function
    guided_decoding_backend: Optional[str] = None  # the body's; the worker accepts only its LLM's
    constraint_key: Optional[str] = None  # the body key the output constraint came from ("tool_choice" too)
    pooling: Optional[protocol.PoolingRequest] = None  # embedding and score: the parsed body (all its inputs)

    @property
    def prompts(self) -> Optional[list]:
        """completion: the one prompt as a list (the server's form, entrypoints/openai/prepare.py)."""
        return None if self.prompt is None else [self.prompt]


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
            raise _error(line, None, INVALID_REQUEST, f"a line must be a JSON object, got {protocol.json_kind(obj)}")
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
    kind = URLS[url]
    if kind in POOLING_KINDS:
        try:
            pooling = protocol.parse_pooling_body(obj.get("body"), kind)
        except protocol.OpenAIError as e:
            raise _error(line, cid, e.code, e.message) from e
        return BatchRequest(cid, line, kind, None, None, None, None, pooling.model, pooling=pooling)
    try:
        parsed = protocol.parse_body(obj.get("body"), kind, CHAT_KEYS if kind == "chat" else COMPLETION_KEYS)
    except protocol.OpenAIError as e:
        raise _error(line, cid, e.code, e.message) from e
    stream = obj["body"].get("stream")
    if stream not in (None, False):
        raise _error(line, cid, INVALID_PARAMETER, f"stream is not supported in batch (got {stream!r})")
    prompt = None
    if kind == "completion":
        if len(parsed.prompts) > 1:
            raise _error(line, cid, INVALID_REQUEST, f"only one prompt per request: got {len(parsed.prompts)} "
                         "prompts; put each on its own line")
        prompt = parsed.prompts[0]
    return BatchRequest(cid, line, kind, parsed.messages, prompt, parsed.sampling_params, parsed.chat_template_kwargs,
                        parsed.model, tools=parsed.tools, tool_choice=parsed.tool_choice,
                        guided_decoding_backend=parsed.guided_decoding_backend, constraint_key=parsed.constraint_key)


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
    or text_completion object as the body (entrypoints/openai/responses.py; the usage without
    prompt_tokens_details). The body's `model` is `request.model` when the line gave one, else
    `model_name`. A RequestOutput that failed at run time (error_code != 200) gives
    `error_record(custom_id, line, "internal_error", error_msg, 500)` instead."""
    if output.error_code != 200:
        message = output.error_msg or f"the request failed (error_code {output.error_code})"
        return error_record(request.custom_id, request.line, INTERNAL_ERROR, message, 500)
    model = request.model if request.model is not None else model_name
    if request.kind == "chat":
        body = responses.chat_completion_body(output, request.sampling_params, model, prompt_tokens_details=False)
    else:
        body = responses.completion_body([output], request.sampling_params, model, prompt_tokens_details=False)
    return {"id": _batch_id(), "custom_id": request.custom_id, "error": None,
            "response": {"status_code": 200, "request_id": output.request_id, "body": body}}


def pooling_record(request: BatchRequest, outputs: list, plan, model_name: str) -> dict:
    """The output line of a finished embedding or score request: status 200 and the server's body
    (entrypoints/openai/responses.py `pooling_body`; `outputs` and `plan` from prepare.prepare_pooling's
    prompts), `request_id` the engine id of its first input. An output that failed at run time gives
    an "internal_error" record (500) instead, as in `response_record`."""
    pooling = dataclasses.replace(request.pooling, model=request.model if request.model is not None else model_name)
    try:
        body = responses.pooling_body(pooling, outputs, plan)
    except protocol.OpenAIError as e:
        return error_record(request.custom_id, request.line, INTERNAL_ERROR, e.message, e.status_code)
    return {"id": _batch_id(), "custom_id": request.custom_id, "error": None,
            "response": {"status_code": 200, "request_id": outputs[0].request_id, "body": body}}


def _batch_id() -> str:
    return "batch_req_" + uuid.uuid4().hex
