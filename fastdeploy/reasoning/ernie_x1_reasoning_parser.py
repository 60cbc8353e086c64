"""The "ernie-x1" reasoning parser."""
from typing import Optional, Tuple

from fastdeploy.reasoning.base import THINK_END, TOOL_CALL_START, ReasoningParser

RESPONSE_START = "<response>"
RESPONSE_END = "</response>"


class ErnieX1ReasoningParser(ReasoningParser):
    """ERNIE-X1: `reasoning</think>` then `<response>answer</response>` or `<tool_call>...`.

    Rules of FastDeploy 2.3's `ErnieX1ReasoningParser.extract_reasoning_content`
    (`fastdeploy/reasoning/ernie_x1_reasoning_parsers.py`, the version that compares the
    positions of `<response>` and `<tool_call>`; reference report section 9, checked against
    that file):

    - No `</think>` -> `(text, "")`: all text is reasoning.
    - Otherwise reasoning = the text before the first `</think>`, verbatim (its trailing "\\n"
      is kept). In the text after that `</think>`:
      - if `<response>` occurs and no `<tool_call>` occurs before it, the content is the text
        between the first `<response>` and the next `</response>` (to the end of the text when
        unterminated), verbatim: `"abc\\n</think>\\n<response>hello\\nworld</response>"` ->
        `("abc\\n", "hello\\nworld")`;
      - otherwise (a tool call first, or no `<response>` at all) the content is "". Note that
        plain text after `</think>` without `<response>` is therefore dropped, as FastDeploy
        does: this model always wraps its answer in `<response>`.
    - Text outside the tags (e.g. newlines between `</think>` and `<response>`, or after
      `</response>`) is not part of either field.

    FastDeploy's `Ernie4_5Processor` also forces `enable_thinking=True` for this parser; that is
    the caller's concern.
    """

    name = "ernie-x1"
    tags = (THINK_END, RESPONSE_START, RESPONSE_END, TOOL_CALL_START)

    def extract(self, text: str) -> Tuple[Optional[str], str]:
        end = text.find(THINK_END)
        if end == -1:
            return text, ""
        reasoning = text[:end]
        rest = text[end + len(THINK_END):]
        response_pos = rest.find(RESPONSE_START)
        tool_pos = rest.find(TOOL_CALL_START)
        if response_pos == -1 or (tool_pos != -1 and tool_pos < response_pos):
            return reasoning, ""
        response = rest[response_pos + len(RESPONSE_START):]
        return reasoning, response.partition(RESPONSE_END)[0]
