"""The "ernie-45-vl" reasoning parser."""
from typing import Optional, Tuple

from fastdeploy.reasoning.base import THINK_END, ReasoningParser


class ErnieVLReasoningParser(ReasoningParser):
    """ERNIE-4.5-VL: everything before `</think>` is reasoning, everything after it is content.

    Rules of FastDeploy 2.3's `ErnieVLReasoningParser.extract_reasoning_content`
    (`fastdeploy/reasoning/ernie_vl_reasoning_parsers.py`; reference report section 9, checked
    against that file):

    - No `</think>` -> `("", text)`: reasoning is "" (not None), the text is content unchanged.
    - Otherwise partition at the first `</think>` -> `(before, after)`, nothing stripped
      (leading newlines of the content and a `<think>` in the reasoning are kept, as FastDeploy
      does); later `</think>`s stay in the content. Empty parts are "".
    - Tool calls get no special treatment: `<tool_call>...` after `</think>` is content.
    """

    name = "ernie-45-vl"
    tags = (THINK_END,)

    def extract(self, text: str) -> Tuple[Optional[str], str]:
        if THINK_END not in text:
            return "", text
        reasoning, _, content = text.partition(THINK_END)
        return reasoning, content
