"""The "qwen3" reasoning parser."""
from typing import Optional, Tuple

from fastdeploy.reasoning.base import THINK_END, THINK_START, ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3: reasoning between `<think>` and `</think>`, the start tag possibly left out.

    Rules of FastDeploy 2.3's `Qwen3ReasoningParser.extract_reasoning_content`
    (`fastdeploy/reasoning/qwen3_reasoning_parsers.py`; reference report section 9, checked
    against that file):

    1. No `</think>` in the text -> `(None, text)`: the whole text is content, unchanged (an
       unterminated `<think>...` is content too).
    2. `<think>` present -> everything up to and including the first `<think>` is dropped; the
       rest is split at its first `</think>` -> `(before, after)`, neither stripped:
       `"<think>a</think>b"` -> `("a", "b")`, `"<think>\\na\\n</think>\\n\\nb"` ->
       `("\\na\\n", "\\n\\nb")`. Text before `<think>` is lost, as in FastDeploy (and vLLM).
    3. No `<think>` -> split at the first `</think>` and strip both sides (whitespace):
       `"a\\n</think>\\n\\nb "` -> `("a", "b")`.
    Later `</think>`s stay in the content (first occurrence wins).

    Differences from FastDeploy, both chosen because `CompletionOutput.text` is a str and a user
    expects no text to vanish:
    - FastDeploy returns content None when it is empty (`"<think>a</think>"` -> `("a", None)`,
      also after stripping in rule 3); we return "".
    - Rule 2 applies only when the first `<think>` comes before the first `</think>`. Otherwise
      (`"a</think>b<think>c"`) FastDeploy takes the text after that later `<think>` and may
      return `(None, "c")`, dropping the reasoning and the end tag; we apply rule 3 instead ->
      `("a", "b<think>c")`. The reference report does not cover this case.
    """

    name = "qwen3"
    tags = (THINK_START, THINK_END)

    def extract(self, text: str) -> Tuple[Optional[str], str]:
        end = text.find(THINK_END)
        if end == -1:
            return None, text
        start = text.find(THINK_START)
        if start != -1 and start < end:
            body = text[start + len(THINK_START):]
            reasoning, _, content = body.partition(THINK_END)
            return reasoning, content
        reasoning, _, content = text.partition(THINK_END)
        return reasoning.strip(), content.strip()
