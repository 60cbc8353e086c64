"""`Ernie4_5Tokenizer`: the name FastDeploy's ERNIE-4.5(-VL) examples import, over this engine's tokenizer.

    from fastdeploy.input.ernie4_5_tokenizer import Ernie4_5Tokenizer
    tokenizer = Ernie4_5Tokenizer.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(messages, tokenize=False)

`from_pretrained` loads the directory's tokenizer as the engine does (input/tokenizer_loader.py:
transformers' tokenizer layer, sentencepiece-only ERNIE directories included, never remote code) and
every other attribute is that tokenizer's. `apply_chat_template` adds the generation prompt unless told
otherwise, as FastDeploy's class does (its templates default `add_generation_prompt` to true), so the
seeds' generate example gets a prompt that ends with "Assistant: ".
"""
from __future__ import annotations

from pathlib import Path
from typing import Union


class Ernie4_5Tokenizer:
    """A transformers tokenizer under FastDeploy's ERNIE tokenizer name (see the module docstring)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained(cls, model_dir: Union[str, Path], **kwargs) -> "Ernie4_5Tokenizer":
        """Load from a local model directory; raises what load_model_tokenizer raises (a missing directory:
        FileNotFoundError). Keyword arguments other loaders take (e.g. `use_fast`) are accepted and unused."""
        from fastdeploy.input.tokenizer_loader import load_model_tokenizer

        path = Path(model_dir).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"Ernie4_5Tokenizer.from_pretrained: {str(model_dir)!r} is not a local directory")
        return cls(load_model_tokenizer(path))

    def apply_chat_template(self, conversation, tokenize: bool = False, add_generation_prompt: bool = True, **kwargs):
        """transformers' apply_chat_template, generation prompt on by default, text by default."""
        return self.tokenizer.apply_chat_template(conversation, tokenize=tokenize,
                                                  add_generation_prompt=add_generation_prompt, **kwargs)

    def __getattr__(self, name: str):
        if name == "tokenizer":  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.tokenizer, name)
