"""The interface every tool-call parser implements, and the part of a completion it reads."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from fastdeploy.engine.request import ToolCall
from fastdeploy.reasoning.base import THINK_END


@dataclass
class ExtractedToolCalls:
    """What a parser found in one completion's text.

    Attributes:
        tools_called: whether at least one call was parsed (all of the text's call blocks valid).
        tool_calls: the calls in the order written; [] when tools_called is False.
        content: with calls, the text outside the call blocks, stripped (None when only whitespace
            is left); without calls, the text unchanged.
    """

    tools_called: bool
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: Optional[str] = None


class ToolParser:
    """Parses the tool calls of a finished completion from its text (no streaming).

    Parsers hold no state, so one instance serves every request. A call's arguments come out as
    JSON text (ensure_ascii=False) and its id as "call_" + random hex (engine/request.py ToolCall).
    A call block whose JSON does not parse, or lacks a function name, makes the whole completion
    "not called" with its text kept, as FastDeploy's parsers do (they catch the error and return
    the model output as content).
    """

    name: ClassVar[str] = ""

    def extract_tool_calls(self, text: str) -> ExtractedToolCalls:
        """The calls written in `text` (one whole completion, or its answer part)."""
        raise NotImplementedError

    def parse_completion(self, text: str, reasoning_content: Optional[str],
                         answer: str) -> tuple[Optional[list[ToolCall]], str]:
        """(tool_calls or None, the completion's new `text`) for the output processor.

        text: the completion's whole detokenized text.
        reasoning_content: what the reasoning parser split off (None: no reasoning parser, or
            none found); the calls are read only in the answer that follows the thinking.
        answer: the completion's `text` after the reasoning split (the whole text without one).
        With calls, the new text is the answer without the call blocks ("" when nothing else is
        left; the thinking stays in it when no reasoning parser split it off); without calls it
        is `answer`, unchanged.
        """
        found = self.extract_tool_calls(answer_part(text, reasoning_content))
        if not found.tools_called:
            return None, answer
        return found.tool_calls, found.content or ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def answer_part(text: str, reasoning_content: Optional[str]) -> str:
    """The part of a completion's `text` after its thinking: the text after the first `</think>`
    when a reasoning parser found reasoning; when `</think>` is not in the text (a special token
    dropped by skip_special_tokens) the text after the reasoning, which then opens it. Without
    reasoning the whole text."""
    if reasoning_content is None:
        return text
    _, end, after = text.partition(THINK_END)
    if end:
        return after
    return text[len(reasoning_content):] if text.startswith(reasoning_content) else text
