"""The `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` format shared by the parsers here."""
from __future__ import annotations

import json
import logging
import re
from typing import Optional

from fastdeploy.engine.request import ToolCall
from fastdeploy.reasoning.base import THINK_END, TOOL_CALL_START
from fastdeploy.tool_parsers.base import ExtractedToolCalls, ToolParser

logger = logging.getLogger("fastdeploy")

TOOL_CALL_END = "</tool_call>"
# a closed block, or an unclosed one running to the end of the text (output cut at a stop string)
BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)(?:" + re.escape(TOOL_CALL_END) + r"|\Z)", re.DOTALL)


class TaggedJsonToolParser(ToolParser):
    """Calls written as `<tool_call>` JSON `</tool_call>` blocks, one call per block.

    Rules (the common part of FastDeploy's ernie parsers and vLLM's hermes parser):
    - Calls are read after the first `</think>` when the text has one (a call the model only
      thought about is no call); with no `<tool_call>` there, nothing is called.
    - Each block's body, stripped, must be a JSON object with a non-empty str "name" and, if
      present, an object "arguments" (missing: {}); an unclosed last block counts when its body is
      complete JSON. One invalid block makes the whole text "not called", text kept.
    - content: the text outside the blocks (before, between and after them; the thinking part
      included), stripped; None when nothing but whitespace is left.
    """

    def extract_tool_calls(self, text: str) -> ExtractedToolCalls:
        start = _answer_start(text)
        blocks = list(BLOCK.finditer(text, start))
        if not blocks or not self.accepts(text[start:blocks[0].start()]):
            return ExtractedToolCalls(False, [], text)
        calls = [_parse_call(m.group(1)) for m in blocks]
        if any(call is None for call in calls):
            logger.warning("%s: a tool-call block is not valid JSON with a function name; no call parsed", self.name)
            return ExtractedToolCalls(False, [], text)
        outside, last = [], 0
        for m in blocks:
            outside.append(text[last:m.start()])
            last = m.end()
        outside.append(text[last:])
        content = "".join(outside).strip()
        return ExtractedToolCalls(True, calls, content or None)

    def accepts(self, before_first_call: str) -> bool:
        """Whether calls count given the answer text before the first block (any text, here)."""
        return True


def _answer_start(text: str) -> int:
    end = text.find(THINK_END)
    return 0 if end == -1 else end + len(THINK_END)


def _parse_call(body: str) -> Optional[ToolCall]:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    name, arguments = value.get("name"), value.get("arguments", {})
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ToolCall.of(name, arguments)
