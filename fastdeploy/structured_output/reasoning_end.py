"""Where a thinking model's reasoning ends, so the constraint starts after it (vLLM's rule).

With `LLM(reasoning_parser=...)` set, a constrained request is unconstrained while it thinks: its
first constrained token is the one after the token whose text completes `</think>`. A prompt whose
last `</think>` comes after its last `<think>` (a chat template that closed the thinking, e.g.
`enable_thinking=False`) starts constrained. The tokens of the thinking, the closing one included, are
not fed to the grammar. A model that never closes its thinking is never constrained.

The tags are found in decoded text, not as token ids: a model whose vocabulary has them as special
tokens (Qwen3, ERNIE) and one whose BPE spells them in pieces (merged differently by context) are
read alike.
"""
from __future__ import annotations

from typing import Sequence

from fastdeploy.reasoning.base import THINK_END, last_think_tag

TAIL_TOKENS = len(THINK_END) + 1  # enough tokens to hold the tag, one character each at worst


class ReasoningEnd:
    """Finds the end of the thinking in a tokenizer's token ids."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def _text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def ended_in_prompt(self, prompt_token_ids: Sequence[int]) -> bool:
        """True when the prompt closed its thinking: its last `</think>` after its last `<think>`."""
        return last_think_tag(self._text(prompt_token_ids)) == THINK_END

    def closes(self, tail: Sequence[int]) -> bool:
        """True when the last TAIL_TOKENS generated tokens `tail` hold `</think>` (the caller checks
        after each token, so the last one completed it)."""
        return THINK_END in self._text(tail)
