"""The interface every reasoning parser implements."""
from typing import ClassVar, Optional, Sequence, Tuple

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"


def last_think_tag(text: str) -> Optional[str]:
    """`<think>` or `</think>`, whichever comes last in `text`; None when it has neither."""
    start, end = text.rfind(THINK_START), text.rfind(THINK_END)
    if start == end:  # both -1
        return None
    return THINK_START if start > end else THINK_END


class ReasoningParser:
    """Splits the final text of a finished completion into (reasoning_content, content).

    `extract` works on text alone: the tags (`<think>`, `</think>`, `<response>`, `<tool_call>` ...)
    must be present in the text. `extract_from_tokens` also takes the completion's token ids and
    the tokenizer, and puts back the tags that are special tokens dropped by
    skip_special_tokens=True (see special_tags.py); the engine uses it. FastDeploy's constructors
    also look the tags up in the tokenizer's vocabulary (RuntimeError when missing); a tag missing
    from the vocabulary here just never matches. Parsers hold no state: one instance can serve
    every request. A streamed completion is split as it runs by `split_unfinished`
    (output/stream_delta.py).
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

    def split_unfinished(self, text: str, thinking_open: bool) -> Optional[Tuple[Optional[str], str]]:
        """For streaming, the split of a completion still running whose text `extract` found no end of
        thinking in: while the thinking is open (`thinking_open`: the prompt left a `<think>` open, or
        the text starts with one), the text so far as reasoning and no content, split as if it ended
        now (a partial end tag waits); (None, "") while the text may still become `<think>`; None
        where `extract`'s split stands (the thinking was not opened, or the parser has no `</think>`)."""
        if THINK_END not in self.tags:
            return None
        if thinking_open or text.lstrip().startswith(THINK_START):
            partial = next((k for k in range(len(THINK_END) - 1, 0, -1) if text.endswith(THINK_END[:k])), 0)
            return self.extract(text[: len(text) - partial] + THINK_END)[0], ""
        if THINK_START.startswith(text.lstrip()):  # it may still open the thinking: nothing to say yet
            return None, ""
        return None

    @staticmethod
    def prompt_opens_thinking(prompt_text: str) -> bool:
        """True when the prompt (decoded with its special tokens) leaves the thinking open: its last
        think tag is `<think>` (a chat template that starts the model thinking)."""
        return last_think_tag(prompt_text) == THINK_START

    def extract(self, text: str) -> Tuple[Optional[str], str]:
        """Return (reasoning_content, content) for the whole completion `text`.

        reasoning_content is None only where the parser's FastDeploy counterpart gives None
        (qwen3 without `</think>`); content is always a str.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
