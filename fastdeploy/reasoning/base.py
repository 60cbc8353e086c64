"""The interface every reasoning parser implements."""
from typing import ClassVar, Optional, Sequence, Tuple

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"


class ReasoningParser:
    """Splits the final text of a finished completion into (reasoning_content, content).

    `extract` works on text alone: the tags (`<think>`, `</think>`, `<response>`, `<tool_call>` ...)
    must be present in the text. `extract_from_tokens` also takes the completion's token ids and
    the tokenizer, and puts back the tags that are special tokens dropped by
    skip_special_tokens=True (see special_tags.py); the engine uses it. FastDeploy's constructors
    also look the tags up in the tokenizer's vocabulary (RuntimeError when missing); a tag missing
    from the vocabulary here just never matches. Parsers hold no state: one instance can serve
    every request. Streaming (per-delta) extraction is not provided.
    """

    name: ClassVar[str] = ""
    tags: ClassVar[Tuple[str, ...]] = ()  # the tag strings `extract` looks for

    def extract_from_tokens(self, text: str, token_ids: Sequence[int], tokenizer, skip_special_tokens: bool,
                            prompt_token_ids: Sequence[int] = ()) -> Tuple[Optional[str], str]:
        """(reasoning_content, content) of a finished completion from its `text` (detokenized with
        `skip_special_tokens`) and its generated `token_ids`; tags that are special tokens count
        even though `text` lost them, and neither field holds special tokens when
        skip_special_tokens is True. See fastdeploy/reasoning/special_tags.py."""
        from fastdeploy.reasoning.special_tags import split_with_special_tags

        return split_with_special_tags(self, text, token_ids, tokenizer, skip_special_tokens, prompt_token_ids)

    def extract(self, text: str) -> Tuple[Optional[str], str]:
        """Return (reasoning_content, content) for the whole completion `text`.

        reasoning_content is None only where the parser's FastDeploy counterpart gives None
        (qwen3 without `</think>`); content is always a str.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
