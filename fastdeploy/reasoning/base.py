"""The interface every reasoning parser implements."""
from typing import ClassVar, Optional, Tuple

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"


class ReasoningParser:
    """Splits the final text of a finished completion into (reasoning_content, content).

    Parsers work on text alone: the special tokens (`<think>`, `</think>`, `<response>`,
    `<tool_call>` ...) must be present in the text, which they are when the completion was
    detokenized with them kept. FastDeploy's constructors also look these tokens up in the
    tokenizer's vocabulary (RuntimeError when missing); we have the text, so no tokenizer is taken
    and no such check is made. Parsers hold no state: one instance can serve every request.
    Streaming (per-delta) extraction is not provided.
    """

    name: ClassVar[str] = ""

    def extract(self, text: str) -> Tuple[Optional[str], str]:
        """Return (reasoning_content, content) for the whole completion `text`.

        reasoning_content is None only where the parser's FastDeploy counterpart gives None
        (qwen3 without `</think>`); content is always a str.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
