"""Where a thinking model's reasoning ends, so the constraint starts after it (vLLM's rule).

With `LLM(reasoning_parser=...)` set, a constrained request is unconstrained while it thinks: its
first constrained token is the one after the token sequence of `</think>`. A prompt whose last
`</think>` comes after its last `<think>` (a chat template that closed the thinking, e.g.
`enable_thinking=False`) starts constrained. The token that closes the thinking is not fed to the
grammar. A model that never closes its thinking is never constrained.
"""
from __future__ import annotations

from typing import Sequence

from fastdeploy.reasoning.base import THINK_END, THINK_START


class ReasoningEnd:
    """The token-id sequences of the think tags in one tokenizer."""

    def __init__(self, tokenizer):
        self.start = tuple(tokenizer.encode(THINK_START, add_special_tokens=False))
        self.end = tuple(tokenizer.encode(THINK_END, add_special_tokens=False))

    def ended_in_prompt(self, prompt_token_ids: Sequence[int]) -> bool:
        """True when the prompt closed its thinking: its last `</think>` after its last `<think>`."""
        last_end = _last_index(prompt_token_ids, self.end)
        return last_end >= 0 and last_end > _last_index(prompt_token_ids, self.start)

    def closes(self, tail: Sequence[int]) -> bool:
        """True when the generated tokens `tail` end with `</think>`."""
        n = len(self.end)
        return n > 0 and tuple(tail[-n:]) == self.end


def _last_index(ids: Sequence[int], pattern: tuple) -> int:
    """Start of the last occurrence of `pattern` in `ids`, or -1."""
    n = len(pattern)
    if n == 0:
        return -1
    for start in range(len(ids) - n, -1, -1):
        if ids[start] == pattern[0] and tuple(ids[start : start + n]) == pattern:
            return start
    return -1
