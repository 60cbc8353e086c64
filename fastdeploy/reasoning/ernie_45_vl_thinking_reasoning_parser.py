"""The "ernie-45-vl-thinking" reasoning parser."""
from typing import Optional, Tuple

from fastdeploy.reasoning.base import THINK_END, TOOL_CALL_START, ReasoningParser


class Ernie45VLThinkingReasoningParser(ReasoningParser):
    """ERNIE-4.5-VL thinking: the output starts in reasoning; `</think>` ends it.

    Rules of FastDeploy 2.3's `Ernie45VLThinkingReasoningParser.extract_reasoning_content`
    (`fastdeploy/reasoning/ernie_45_vl_thinking_reasoning_parser.py`; reference report section
    9, checked against that file):

    - No `</think>` -> `(text, "")`: everything is reasoning (an unfinished thought).
    - Otherwise partition at the first `</think>` into (reasoning, content), nothing stripped;
      later `</think>`s stay in the content.
    - If the content contains `<tool_call>` and the text before its first `<tool_call>` is only
      "\\n" characters (or nothing), the content is "" (the tool parser reads the call from the
      full text): `"reasoning</think>\\n<tool_call>..."` -> `("reasoning", "")`. Only "\\n" is
      skipped, as in FastDeploy (`lstrip("\\n")`): a space or "\\r" before `<tool_call>`, or any
      text, keeps the content verbatim.
    - Otherwise the content is kept verbatim: `"reasoning</think>\\nresponse"` ->
      `("reasoning", "\\nresponse")`.
    """

    name = "ernie-45-vl-thinking"
    tags = (THINK_END, TOOL_CALL_START)

    def extract(self, text: str) -> Tuple[Optional[str], str]:
        if THINK_END not in text:
            return text, ""
        reasoning, _, content = text.partition(THINK_END)
        if TOOL_CALL_START in content:
            prefix = content.partition(TOOL_CALL_START)[0]
            if not prefix.lstrip("\n"):
                return reasoning, ""
        return reasoning, content
