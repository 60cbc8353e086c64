"""Reasoning parsers: split a finished completion's text into (reasoning_content, content).

    from fastdeploy.reasoning import get_reasoning_parser
    reasoning_content, text = get_reasoning_parser("ernie_x1").extract(completion_text)
    # or, when the tags may be special tokens dropped from the text (what the engine does):
    reasoning_content, text = parser.extract_from_tokens(text, token_ids, tokenizer, skip_special_tokens)

Names follow FastDeploy 2.3's `--reasoning-parser` values; as in FastDeploy's
`ReasoningParserManager`, "_" in a name is read as "-" (so "ernie_x1" is "ernie-x1").
"""
from typing import Dict, Type

from fastdeploy.reasoning.base import ReasoningParser
from fastdeploy.reasoning.ernie_45_vl_thinking_reasoning_parser import Ernie45VLThinkingReasoningParser
from fastdeploy.reasoning.ernie_vl_reasoning_parser import ErnieVLReasoningParser
from fastdeploy.reasoning.ernie_x1_reasoning_parser import ErnieX1ReasoningParser
from fastdeploy.reasoning.qwen3_reasoning_parser import Qwen3ReasoningParser

REASONING_PARSERS: Dict[str, Type[ReasoningParser]] = {
    cls.name: cls
    for cls in (
        Qwen3ReasoningParser,
        ErnieVLReasoningParser,
        Ernie45VLThinkingReasoningParser,
        ErnieX1ReasoningParser,
    )
}


def get_reasoning_parser(name: str) -> ReasoningParser:
    """Return a new instance of the parser registered as `name` ("_" read as "-").

    Parsers are stateless, so the instance may be shared. An unknown name raises ValueError
    ("reasoning_parser ... valid names: ..."); FastDeploy raises KeyError there.
    """
    key = name.replace("_", "-") if isinstance(name, str) else name
    cls = REASONING_PARSERS.get(key) if isinstance(key, str) else None
    if cls is None:
        raise ValueError(
            f"reasoning_parser {name!r} is not supported; valid names: "
            f"{', '.join(sorted(REASONING_PARSERS))} (\"_\" may be written for \"-\")"
        )
    return cls()


__all__ = [
    "REASONING_PARSERS",
    "ReasoningParser",
    "get_reasoning_parser",
    "Qwen3ReasoningParser",
    "ErnieVLReasoningParser",
    "Ernie45VLThinkingReasoningParser",
    "ErnieX1ReasoningParser",
]
