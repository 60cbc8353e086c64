"""Tool-call parsers: a finished completion's text -> OpenAI-shaped tool calls.

    from fastdeploy.tool_parsers import get_tool_parser
    found = get_tool_parser("qwen3").extract_tool_calls(completion_text)
    found.tools_called, found.tool_calls, found.content

`LLM(tool_call_parser=name)` hands the parser to the output processor, which fills
`CompletionOutput.tool_calls` (engine/request.py ToolCall) and keeps in `text` what the model
wrote outside the calls. `tool_choice.py` holds what `LLM.chat(tools=..., tool_choice=...)` needs:
the tools' validation, the JSON schema that forces a call, and reading that JSON back.

Names follow FastDeploy's and vLLM's `--tool-call-parser` values; as for reasoning parsers, "_" in a
name is read as "-" (so "ernie_x1" is "ernie-x1").
"""
from typing import Dict, Type

from fastdeploy.tool_parsers.base import ExtractedToolCalls, ToolParser
from fastdeploy.tool_parsers.ernie_45_vl_thinking_tool_parser import Ernie45VLThinkingToolParser
from fastdeploy.tool_parsers.ernie_x1_tool_parser import ErnieX1ToolParser
from fastdeploy.tool_parsers.hermes_tool_parser import HermesToolParser
from fastdeploy.tool_parsers.qwen3_tool_parser import Qwen3ToolParser

TOOL_PARSERS: Dict[str, Type[ToolParser]] = {
    cls.name: cls for cls in (ErnieX1ToolParser, Ernie45VLThinkingToolParser, Qwen3ToolParser, HermesToolParser)
}


def get_tool_parser(name: str) -> ToolParser:
    """A new instance of the parser registered as `name` ("_" read as "-"); parsers are stateless.

    An unknown name (or a non-str) raises ValueError listing the valid names.
    """
    key = name.replace("_", "-") if isinstance(name, str) else None
    cls = TOOL_PARSERS.get(key)
    if cls is None:
        raise ValueError(
            f"tool_call_parser {name!r} is not supported; valid names: "
            f"{', '.join(sorted(TOOL_PARSERS))} (\"_\" may be written for \"-\")"
        )
    return cls()


__all__ = [
    "TOOL_PARSERS",
    "ExtractedToolCalls",
    "ToolParser",
    "get_tool_parser",
    "ErnieX1ToolParser",
    "Ernie45VLThinkingToolParser",
    "Qwen3ToolParser",
    "HermesToolParser",
]
