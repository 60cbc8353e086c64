"""Chat messages: validation and rendering with the model's (or a given) Jinja chat template."""
from pathlib import Path
from typing import Optional

ROLES = ("system", "user", "assistant", "tool", "developer")


def is_conversation(messages) -> bool:
    """True for one conversation (list of message dicts), False for a batch (list of lists)."""
    return isinstance(messages, list) and (not messages or isinstance(messages[0], dict))


def validate_conversation(conversation, index: int) -> None:
    """Raise ValueError/TypeError naming conversation `index` and message for malformed input."""
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
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(
                        f"{where}: content parts must be {{'type': 'text', 'text': str}} for this model, got {part!r}"
                    )
        elif not isinstance(content, str) and not (content is None and message["role"] == "assistant"):
            raise TypeError(f"{where}: 'content' must be a str or a list of text parts, got {type(content).__name__}")


def _flatten_text_parts(conversation: list[dict]) -> list[dict]:
    """Turn OpenAI-style text parts into plain strings (templates of text models expect strings)."""
    flat = []
    for message in conversation:
        content = message.get("content")
        if isinstance(content, list):
            message = {**message, "content": "".join(part["text"] for part in content)}
        flat.append(message)
    return flat


def load_chat_template(template: Optional[str]) -> Optional[str]:
    """A template given as a string, or as a path to a .jinja file, or None."""
    if template is None:
        return None
    if not isinstance(template, str):
        raise TypeError(f"chat_template must be a str (template or path), got {type(template).__name__}")
    path = Path(template)
    if len(template) < 4096 and "{" not in template and path.is_file():
        return path.read_text(encoding="utf-8")
    return template


def render_conversation(tokenizer, conversation: list[dict], chat_template: Optional[str],
                        chat_template_kwargs: Optional[dict]) -> str:
    """The prompt text: template applied with the generation prompt and the extra kwargs."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if template is None:
        raise ValueError("this model has no chat template: pass chat_template=... or use LLM.generate")
    return tokenizer.apply_chat_template(
        _flatten_text_parts(conversation),
        chat_template=template,
        tokenize=False,
        add_generation_prompt=True,
        **(chat_template_kwargs or {}),
    )
