"""OpenAI request bodies -> `OpenAIRequest` (prompt or messages, SamplingParams, tools): one parser
for the HTTP server and run-batch. Pure data, no engine.

Bodies follow OpenAI's API reference (Chat Completions, Completions, Embeddings); the sampling extras
(`top_k`, `min_p`, `repetition_penalty`, ...) and `chat_template_kwargs` follow vLLM's server; the
output keys (`response_format`, `guided_*`, `logit_bias`, `tools`, ...) are mapped by
constraints.py. docs/batch_format.md lists every key and what it maps to.

- `parse_body(body, kind, accepted)`: the checks both users share. A key outside `accepted` is
  an error naming it; a key whose value is null counts as absent.
- `parse_chat_request(body, served_model_names)` / `parse_completion_request(...)`: the server's,
  which adds `stream`, `stream_options`, `prompt_logprobs` and `echo` (false only), takes a list
  of prompts for completions, and answers a model it does not serve with 404.
- `parse_pooling_body(body, kind)` -> `PoolingRequest`: a /v1/embeddings (OpenAI's Embeddings
  body, vLLM's `normalize` and `truncate_prompt_tokens`) or /v1/score body (vLLM's `text_1` /
  `text_2`); `parse_embedding_request` / `parse_score_request` are the server's (404 for the model).

Every error is an `OpenAIError` (status 400, or 404 for the model) whose message names the key,
the value and what is allowed; `.body()` is OpenAI's error object.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Union

from fastdeploy.engine.pooling_params import PoolingParams
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints import scoring
from fastdeploy.entrypoints.chat_utils import validate_conversation
from fastdeploy.entrypoints.openai import constraints

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
SCORE_URL = "/v1/score"
URLS = {"chat": CHAT_URL, "completion": COMPLETIONS_URL, "embedding": EMBEDDINGS_URL, "score": SCORE_URL}

# OpenAIError codes (run-batch writes them in its error records)
INVALID_REQUEST = "invalid_request"  # the body's shape, its messages or prompt
UNKNOWN_PARAMETER = "unknown_parameter"  # a body key this server does not know
INVALID_PARAMETER = "invalid_parameter"  # a known body key with a bad value (SamplingParams' checks)
MODEL_NOT_FOUND = "model_not_found"  # (404) a model this server does not serve
UNSUPPORTED_TASK = "unsupported_task"  # an endpoint the model cannot answer (text from an embedding model, ...)

SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
                 "frequency_penalty", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
                 "stop_token_ids", "skip_special_tokens", "include_stop_str_in_output", "bad_words")
OUTPUT_KEYS = (*constraints.STRUCTURED_KEYS, *constraints.LOGITS_KEYS)  # constraints.py maps them
IGNORED_KEYS = ("model", "user")  # model: checked as a string here, against the served names by the server
CHAT_KEYS = ("messages", "max_completion_tokens", "logprobs", "top_logprobs", "chat_template_kwargs",
             *SAMPLING_KEYS, *OUTPUT_KEYS, *constraints.TOOL_KEYS, *IGNORED_KEYS)
COMPLETION_KEYS = ("prompt", "logprobs", *SAMPLING_KEYS, *OUTPUT_KEYS, *IGNORED_KEYS)
SERVER_KEYS = ("stream", "stream_options", "prompt_logprobs", "echo")  # the server's on top of the above
STREAM_OPTIONS = ("include_usage", "continuous_usage_stats")
EMBEDDING_KEYS = ("input", "encoding_format", "dimensions", "normalize", "truncate_prompt_tokens", *IGNORED_KEYS)
SCORE_KEYS = ("text_1", "text_2", "truncate_prompt_tokens", *IGNORED_KEYS)
ENCODING_FORMATS = ("float", "base64")


class OpenAIError(Exception):
    """A request the API answers with an error: HTTP `status_code` and OpenAI's error object.

    Attributes: status_code (400, 404, ...), message (names the key, the value and what is
    allowed), type (OpenAI's: "invalid_request_error" for 4xx), param (the body key at fault or
    None), code (one of the module's code constants, or None)."""

    def __init__(self, status_code: int, message: str, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status_code, self.message, self.type, self.param, self.code = status_code, message, type, param, code

    def body(self) -> dict:
        """`{"error": {"message", "type", "param", "code"}}`, OpenAI's error response body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class OpenAIRequest:
    """One parsed body, ready for the engine (`LLM.chat`'s inputs for kind "chat", `LLM.generate`'s
    for "completion")."""

    kind: str  # "chat" or "completion"
    sampling_params: SamplingParams  # a forcing tool_choice's JSON-schema constraint included
    messages: Optional[list] = None  # chat: OpenAI's messages, validated
    prompts: Optional[list] = None  # completion: each a str or a list of token ids; choice i*n + j is prompt i's j-th
    chat_template_kwargs: Optional[dict] = None  # chat: passed to the chat template
    tools: Optional[list] = None  # chat: the validated tools, rendered by the chat template
    tool_choice: Union[str, dict, None] = None  # chat: None, "auto", "none", "required" or a named function
    constraint_key: Optional[str] = None  # the body key the output constraint came from ("tool_choice" too)
    guided_decoding_backend: Optional[str] = None  # the body's; the engine accepts only its own
    model: Optional[str] = None  # the body's model (the server: a served name, the first when absent)
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    continuous_usage_stats: bool = False  # stream_options.continuous_usage_stats: usage in every chunk


@dataclass
class PoolingRequest:
    """One parsed /v1/embeddings (kind "embedding": `LLM.embed`'s inputs) or /v1/score body (kind
    "score": `LLM.score`'s pairs)."""

    kind: str  # "embedding" or "score"
    pooling_params: PoolingParams  # dimensions, normalize, truncate_prompt_tokens (score: truncation only)
    prompts: Optional[list] = None  # embedding: each a str or a list of token ids; data[i] is prompt i's
    pairs: Optional[list] = None  # score: the (text_1, text_2) pairs; data[i] is pair i's score
    encoding_format: str = "float"  # embedding: "float" (arrays of numbers) or "base64" (float32 bytes)
    model: Optional[str] = None


def parse_chat_request(body, served_model_names: Iterable[str]) -> OpenAIRequest:
    """A `POST /v1/chat/completions` body as the server takes it; OpenAIError for any bad input."""
    return _parse_server_body(body, "chat", served_model_names)


def parse_completion_request(body, served_model_names: Iterable[str]) -> OpenAIRequest:
    """A `POST /v1/completions` body as the server takes it (`prompt`: a string, token ids, or a
    non-empty list of either); OpenAIError for any bad input."""
    return _parse_server_body(body, "completion", served_model_names)


def parse_embedding_request(body, served_model_names: Iterable[str]) -> PoolingRequest:
    """A `POST /v1/embeddings` body (OpenAI's: `input` a string, token ids, or a non-empty array of
    either; `encoding_format` "float" or "base64"; `dimensions`; vLLM's `normalize` and
    `truncate_prompt_tokens`); OpenAIError for any bad input, 404 for a model not served."""
    return _served_pooling_request(parse_pooling_body(body, "embedding"), served_model_names)


def parse_score_request(body, served_model_names: Iterable[str]) -> PoolingRequest:
    """A `POST /v1/score` body (vLLM's: `text_1` and `text_2`, each a string or an array of strings,
    paired 1 -> 1, 1 -> N or N -> N; `truncate_prompt_tokens`); OpenAIError as above."""
    return _served_pooling_request(parse_pooling_body(body, "score"), served_model_names)


def parse_pooling_body(body, kind: str) -> PoolingRequest:
    """The checks run-batch and the server share for a `kind` ("embedding" or "score") body;
    OpenAIError (400) naming the key, as `parse_body`."""
    body, model = _checked_body(body, kind, EMBEDDING_KEYS if kind == "embedding" else SCORE_KEYS)
    kwargs = {k: body[k] for k in ("dimensions", "normalize", "truncate_prompt_tokens") if k in body}
    try:
        params = PoolingParams(**kwargs)
    except (ValueError, TypeError) as e:  # PoolingParams' messages name the field
        raise _bad(_named_key(str(e), body), str(e)) from e
    if kind == "score":
        try:
            pairs = scoring.score_pairs(body.get("text_1"), body.get("text_2"))
        except (ValueError, TypeError) as e:
            raise _bad("text_2" if str(e).startswith("text_2") else "text_1", str(e), INVALID_REQUEST) from e
        return PoolingRequest(kind, params, pairs=pairs, model=model)
    encoding_format = body.get("encoding_format", "float")
    if encoding_format not in ENCODING_FORMATS:
        raise _bad("encoding_format",
                   f"encoding_format must be one of {list(ENCODING_FORMATS)}, got {encoding_format!r}")
    return PoolingRequest(kind, params, prompts=_prompts(body, "input"), encoding_format=encoding_format, model=model)


def _served_pooling_request(request: PoolingRequest, served_model_names: Iterable[str]) -> PoolingRequest:
    request.model = served_model(request.model, list(served_model_names))
    return request


def parse_body(body, kind: str, accepted: Iterable[str]) -> OpenAIRequest:
    """The checks run-batch and the server share: `body` (a dict from JSON) of a `kind` request
    ("chat" or "completion") with keys from `accepted` only. OpenAIError (400) for any input, its
    message naming the key; `code` is INVALID_REQUEST, UNKNOWN_PARAMETER or INVALID_PARAMETER."""
    try:
        return _parse(body, kind, tuple(accepted))
    except OpenAIError:
        raise
    except Exception as e:  # a safety net: the checks are meant to leave nothing for it
        raise OpenAIError(400, f"{type(e).__name__}: {e}", code=INVALID_REQUEST) from e


def _bad(param: Optional[str], message: str, code: str = INVALID_PARAMETER) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def json_kind(value) -> str:
    """How an error message names a JSON value's type: "an object", "an array", "null", ..."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _is_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def _checked_body(body, kind: str, accepted) -> tuple[dict, Optional[str]]:
    """(the body without its null keys, its model): OpenAIError for a body that is not an object, a
    key outside `accepted` or a model that is not a string."""
    if not isinstance(body, dict):
        raise _bad(None, f"body must be an object, got {json_kind(body)}", INVALID_REQUEST)
    unknown = sorted(set(body) - set(accepted))
    if unknown:
        raise _bad(unknown[0], f"unknown key(s) {unknown} in the body of {URLS[kind]}; accepted: {sorted(accepted)}",
                   UNKNOWN_PARAMETER)
    body = {k: v for k, v in body.items() if v is not None}  # null = absent
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", f"model must be a string, got {model!r}")
    return body, model


def _parse(body, kind: str, accepted: tuple) -> OpenAIRequest:
    body, model = _checked_body(body, kind, accepted)
    if kind == "chat":
        request = OpenAIRequest(kind, SamplingParams(), messages=_chat_messages(body), model=model)
        request.chat_template_kwargs = body.get("chat_template_kwargs")
        if request.chat_template_kwargs is not None and not isinstance(request.chat_template_kwargs, dict):
            raise _bad("chat_template_kwargs",
                       f"chat_template_kwargs must be an object, got {json_kind(request.chat_template_kwargs)}")
    else:
        request = OpenAIRequest(kind, SamplingParams(), prompts=_prompts(body), model=model)
    request.sampling_params, request.constraint_key = _sampling_params(body, kind)
    key = "guided_decoding_backend"
    try:
        if key in body:
            request.guided_decoding_backend = constraints.backend_name(body[key])
        if kind == "chat":
            key = "tool_choice" if "tool_choice" in body else "tools"
            _add_tools(request, body)
    except (ValueError, TypeError) as e:  # the messages name the key (tools[i], tool_choice, ...)
        raise _bad(key, str(e)) from e
    return request


def _add_tools(request: OpenAIRequest, body: dict) -> None:
    """The body's tools and tool_choice on `request`; a forcing tool_choice constrains its output."""
    request.tools, request.tool_choice = constraints.tools_and_choice(body)
    forced = constraints.forced_call_params(request.sampling_params, request.tools, request.tool_choice,
                                            request.constraint_key)
    if forced is not request.sampling_params:
        request.sampling_params, request.constraint_key = forced, "tool_choice"


def _chat_messages(body: dict) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", f"messages must be a non-empty array of message objects, got {messages!r}",
                   INVALID_REQUEST)
    try:
        validate_conversation(messages, 0, multimodal=True)  # a text model refuses media parts when it renders
    except (ValueError, TypeError) as e:
        raise _bad("messages", "messages: " + str(e).replace("conversation 0, ", "", 1), INVALID_REQUEST) from e
    return messages


def _prompts(body: dict, key: str = "prompt") -> list:
    """body[key] as a list of prompts: a string, token ids, or a non-empty array of either."""
    prompt = body.get(key)
    if isinstance(prompt, list) and prompt and not all(_is_id(t) for t in prompt):
        prompts = prompt if all(isinstance(p, (str, list)) for p in prompt) else [prompt]
    else:
        prompts = [prompt]
    for p in prompts:
        if not (isinstance(p, str) and p or isinstance(p, list) and p and all(_is_id(t) for t in p)):
            raise _bad(key, f"{key} must be a non-empty string or a non-empty array of token ids (ints >= 0), "
                       f"or an array of those, got {prompt!r}", INVALID_REQUEST)
    return [p if isinstance(p, str) else list(p) for p in prompts]


def _sampling_params(body: dict, kind: str) -> tuple[SamplingParams, Optional[str]]:
    """(the SamplingParams, the body key its guided_decoding came from or None)."""
    kwargs = {k: body[k] for k in (*SAMPLING_KEYS, "prompt_logprobs") if k in body}
    if "max_completion_tokens" in body:
        value = body["max_completion_tokens"]
        if "max_tokens" in kwargs and kwargs["max_tokens"] != value:
            raise _bad("max_completion_tokens", f"max_tokens={kwargs['max_tokens']!r} and max_completion_tokens="
                       f"{value!r} differ: give one (max_completion_tokens is the newer name)")
        if not _is_id(value) or value < 1:
            raise _bad("max_completion_tokens", f"max_completion_tokens must be an int >= 1, got {value!r}")
        kwargs["max_tokens"] = value
    logprobs = body.get("logprobs")
    if kind == "chat":
        top = body.get("top_logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise _bad("logprobs", f"logprobs must be true or false for chat, got {logprobs!r}")
        if top is not None and logprobs is not True:
            raise _bad("top_logprobs", "top_logprobs needs logprobs=true")
        if top is not None and not _is_id(top):
            raise _bad("top_logprobs", f"top_logprobs must be an int >= 0, got {top!r}")
        if logprobs:
            kwargs["logprobs"] = top or 0
    elif logprobs is not None:
        if not _is_id(logprobs):
            raise _bad("logprobs", f"logprobs must be an int >= 0 for completions, got {logprobs!r}")
        kwargs["logprobs"] = logprobs
    try:
        kwargs["guided_decoding"], constraint_key = constraints.guided_decoding(body)
        if "logit_bias" in body:
            kwargs["logit_bias"] = constraints.logit_bias(body["logit_bias"])
        kwargs.update({k: body[k] for k in ("allowed_token_ids", "logits_processors_args") if k in body})
        return SamplingParams(**kwargs), constraint_key
    except (ValueError, TypeError) as e:  # the messages (SamplingParams', constraints.py's) name the key
        raise _bad(_named_key(str(e), body), str(e)) from e


def _named_key(message: str, body: dict) -> Optional[str]:
    """The body key an error message starts with (SamplingParams and constraints.py name it first)."""
    head = message.split(" ", 1)[0].split(".", 1)[0].split("[", 1)[0]
    return head if head in body else None


# ---- the server's keys -----------------------------------------------------------------------------
def _parse_server_body(body, kind: str, served_model_names: Iterable[str]) -> OpenAIRequest:
    names = list(served_model_names)
    accepted = (*(CHAT_KEYS if kind == "chat" else COMPLETION_KEYS), *SERVER_KEYS)
    request = parse_body(body, kind, accepted)
    request.model = served_model(request.model, names)
    body = {k: v for k, v in body.items() if v is not None}
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", f"stream must be true or false, got {stream!r}")
    request.stream = stream
    if "stream_options" in body:
        _stream_options(request, body["stream_options"])
    echo = body.get("echo", False)
    if echo is not False:
        raise _bad("echo", f"echo must be false (echoing the prompt is not supported), got {echo!r}")
    return request


def served_model(model: Optional[str], names: list[str]) -> str:
    """The body's model as the server answers it: the first served name when absent; OpenAIError 404
    for a name it does not serve."""
    if model is None:
        return names[0]
    if model not in names:
        raise OpenAIError(404, f"the model {model!r} does not exist; this server serves {names}",
                          param="model", code=MODEL_NOT_FOUND)
    return model


def _stream_options(request: OpenAIRequest, options) -> None:
    if not request.stream:
        raise _bad("stream_options", "stream_options is only allowed with stream=true")
    if not isinstance(options, dict):
        raise _bad("stream_options", f"stream_options must be an object of {list(STREAM_OPTIONS)}, got {options!r}")
    unknown = sorted(set(options) - set(STREAM_OPTIONS))
    if unknown:
        raise _bad("stream_options", f"unknown key(s) {unknown} in stream_options; accepted: {list(STREAM_OPTIONS)}",
                   UNKNOWN_PARAMETER)
    for key in STREAM_OPTIONS:
        value = options.get(key)
        if value is not None and not isinstance(value, bool):
            raise _bad("stream_options", f"stream_options.{key} must be true or false, got {value!r}")
    request.include_usage = bool(options.get("include_usage"))
    request.continuous_usage_stats = bool(options.get("continuous_usage_stats"))
