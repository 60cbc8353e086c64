"""Chat messages: validation and rendering with the model's (or a given) Jinja chat template.

Tool use (OpenAI's message shapes): an assistant message may carry `tool_calls` (a list of
`{"id"?, "type": "function", "function": {"name": str, "arguments": JSON str or dict}}`, content
None or text) and a `{"role": "tool", "content": str, "tool_call_id"?: str}` message gives a call's
result. For the template, string arguments are parsed into dicts (templates write them with
`tojson`; vLLM does the same), and the call's tools are passed as `tools=`.
"""
import json
import os
from pathlib import Path
from typing import Optional

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

ROLES = ("system", "user", "assistant", "tool", "developer")
MEDIA_PARTS = {"image_url": "image", "video_url": "video"}  # content part type -> modality


def is_conversation(messages) -> bool:
    """True for one conversation (list of message dicts), False for a batch (list of lists)."""
    return isinstance(messages, list) and (not messages or isinstance(messages[0], dict))


def validate_conversation(conversation, index: int, multimodal: bool = False) -> None:
    """Raise ValueError/TypeError naming conversation `index` and message for malformed input.
    `multimodal`: the model takes image_url / video_url parts (see `media_parts`)."""
    if not isinstance(conversation, list) or not conversation:
        raise ValueError(f"conversation {index} must be a non-empty list of message dicts, got {conversation!r}")
    for j, message in enumerate(conversation):
        where = f"conversation {index}, message {j}"
        if not isinstance(message, dict):
            raise TypeError(f"{where} must be a dict with 'role' and 'content', got {type(message).__name__}")
        if message.get("role") not in ROLES:
            raise ValueError(f"{where}: 'role' must be one of {ROLES}, got {message.get('role')!r}")
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                _validate_part(part, where, multimodal)
        elif not isinstance(content, str) and not (content is None and message["role"] == "assistant"):
            raise TypeError(f"{where}: 'content' must be a str or a list of text parts, got {type(content).__name__}")
        if message.get("tool_calls") is not None:
            _validate_tool_calls(message, where)


def _validate_tool_calls(message: dict, where: str) -> None:
    """An assistant message's `tool_calls`: a list of {"type": "function", "function": {"name": str,
    "arguments": JSON object text or dict}}."""
    calls = message["tool_calls"]
    if message["role"] != "assistant":
        raise ValueError(f"{where}: only assistant messages carry 'tool_calls', got role {message['role']!r}")
    if not isinstance(calls, list):
        raise TypeError(f"{where}: 'tool_calls' must be a list of calls, got {type(calls).__name__}")
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}, tool_calls[{k}]: needs {{'type': 'function', 'function': {{'name': str, "
                             f"'arguments': str}}}}, got {str(call)[:200]}")
        _call_arguments(function.get("arguments", {}), f"{where}, tool_calls[{k}]")


def _call_arguments(arguments, where: str) -> dict:
    """A call's arguments as a dict (JSON object text is parsed)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as e:
            raise ValueError(f"{where}: 'arguments' is not valid JSON ({e}): {arguments[:200]!r}") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"{where}: 'arguments' must be a JSON object (str or dict), got {str(arguments)[:200]}")
    return arguments


def _validate_part(part, where: str, multimodal: bool) -> None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return
    if kind in MEDIA_PARTS and multimodal:
        _media_url(part, where)
        return
    if kind in MEDIA_PARTS:
        raise ValueError(f"{where}: content parts must be {{'type': 'text', 'text': str}} for this model (it takes "
                         f"no images or videos), got {str(part)[:200]}")
    accepted = ["text"] + (list(MEDIA_PARTS) if multimodal else [])
    raise ValueError(f"{where}: Unknown content part type {kind!r}; content parts accepted: {accepted} "
                     f"(text parts need a str 'text'), got {str(part)[:200]}")


def _media_url(part: dict, where: str = "") -> str:
    """The URL of an image_url / video_url part ({"url": str} or a plain str)."""
    value = part.get(part["type"])
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise ValueError(f"{where}: a {part['type']!r} part needs {{'{part['type']}': {{'url': str}}}}, got {str(part)[:200]}")
    return url


def media_parts(conversation: list[dict]) -> list[tuple[str, str]]:
    """(modality, url) of every image_url / video_url part of a validated conversation, in order."""
    return [(MEDIA_PARTS[part["type"]], _media_url(part)) for message in conversation
            if isinstance(message.get("content"), list) for part in message["content"] if part["type"] in MEDIA_PARTS]


# arguments render_conversation passes to apply_chat_template itself
RENDER_ARGUMENTS = ("conversation", "chat_template", "tokenize", "add_generation_prompt", "tools")


def validate_template_kwargs(kwargs: Optional[dict]) -> None:
    """TypeError for a non-str key, ValueError for a key that render_conversation sets itself."""
    for key in kwargs or {}:
        if not isinstance(key, str):
            raise TypeError(f"chat_template_kwargs keys must be str, got {key!r}")
        if key in RENDER_ARGUMENTS:
            raise ValueError(f"chat_template_kwargs must not set {key!r}: chat() sets {', '.join(RENDER_ARGUMENTS)}")


def _template_messages(conversation: list[dict]) -> list[dict]:
    """Messages as templates expect them: OpenAI-style text parts joined into plain strings
    (content holding image/video parts stays a list for the template to place them), tool calls'
    arguments as dicts."""
    flat = []
    for message in conversation:
        content = message.get("content")
        if isinstance(content, list) and all(part["type"] == "text" for part in content):
            message = {**message, "content": "".join(part["text"] for part in content)}
        if message.get("tool_calls"):
            message = {**message, "tool_calls": [_template_call(call) for call in message["tool_calls"]]}
        flat.append(message)
    return flat


def _template_call(call: dict) -> dict:
    function = call["function"]
    return {**call, "function": {**function, "arguments": _call_arguments(function.get("arguments", {}), "")}}


TEMPLATE_SUFFIXES = (".jinja", ".j2", ".jinja2")
JINJA_MARKERS = ("{%", "{{")


def _looks_like_path(value: str) -> bool:
    """A value meant as a file name: no Jinja markers, and a template suffix or a path separator."""
    if any(marker in value for marker in JINJA_MARKERS):
        return False
    separators = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    return value.lower().endswith(TEMPLATE_SUFFIXES) or any(sep in value for sep in separators)


def load_chat_template(template: Optional[str]) -> Optional[str]:
    """The template text of `chat_template`: a Jinja string, or a path to a file holding one, or None.

    A value without Jinja markers (`{%`, `{{`) that names an existing file is read from it (UTF-8).
    Raises TypeError for a non-str, FileNotFoundError when the value looks like a path (ends in
    .jinja/.j2/.jinja2 or contains a path separator, and has no Jinja markers) but no file is
    there, and ValueError (with the line number) when the template has a Jinja syntax error.
    """
    if template is None:
        return None
    if not isinstance(template, str):
        raise TypeError(f"chat_template must be a str (template or path), got {type(template).__name__}")
    if not any(marker in template for marker in JINJA_MARKERS) and len(template) < 4096:
        path = Path(template).expanduser()
        if path.is_file():
            template = path.read_text(encoding="utf-8")
        elif _looks_like_path(template):
            raise FileNotFoundError(
                f"chat_template={template!r} looks like a path to a template file, but "
                f"{'it is a directory' if path.is_dir() else 'no such file exists'}: "
                "pass an existing .jinja file or the template text itself"
            )
    check_template_syntax(template)
    return template


def check_template_syntax(template: str, source: str = "chat_template") -> None:
    """ValueError naming `source` and the line when `template` is not valid Jinja.

    Parsed with the tags transformers' chat-template environment knows: loop controls
    ({% break %}, {% continue %}) and {% generation %}...{% endgeneration %}."""
    try:
        _syntax_env().parse(template)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"{source} has a Jinja syntax error at line {e.lineno}: {e.message}") from e


class _GenerationTag(jinja2.ext.Extension):
    """Parses transformers' {% generation %} block (its body is rendered unchanged)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _syntax_env() -> jinja2.Environment:
    return jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )


def render_conversation(tokenizer, conversation: list[dict], chat_template: Optional[str],
                        chat_template_kwargs: Optional[dict], index: int = 0,
                        tools: Optional[list[dict]] = None) -> str:
    """The prompt text: template applied with the generation prompt, the validated `tools`
    (the template's `tools` variable; None when there are none) and the extra kwargs.

    The template is `chat_template` or else the tokenizer's. A Jinja error while rendering
    (a syntax error, the template's `raise_exception(message)`, an undefined call) raises
    ValueError naming `chat_template`, conversation `index` and the template's message."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if template is None:
        raise ValueError("this model has no chat template: pass chat_template=... or use LLM.generate")
    source = "chat_template" if chat_template else "the model's chat_template"
    try:
        return tokenizer.apply_chat_template(
            _template_messages(conversation),
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
            tools=tools,
            **(chat_template_kwargs or {}),
        )
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"{source} has a Jinja syntax error at line {e.lineno}: {e.message}") from e
    except jinja2.TemplateError as e:
        raise ValueError(f"{source} failed to render conversation {index}: {e}") from e
