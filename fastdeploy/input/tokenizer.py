"""The tokenizer of an opened model: from the GGUF file's metadata, or from the model directory
(or the directory `LLM(tokenizer=...)` names), chat template included."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from fastdeploy.model_executor.model_loader.source import ModelSource


def load_tokenizer(source: ModelSource, tokenizer_dir: Optional[str] = None):
    """A transformers tokenizer (tokenizer layer only; torch is not needed).

    tokenizer_dir: a directory to read instead of the model's own tokenizer. Raises what the
    loaders raise for a directory without a readable tokenizer (see tokenizer_loader.py).
    """
    from fastdeploy.input.tokenizer_loader import load_model_tokenizer

    if tokenizer_dir is not None:
        return load_model_tokenizer(Path(tokenizer_dir))
    if source.gguf_file is not None:
        from fastdeploy.input.gguf_tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(source.gguf_file)
    return load_model_tokenizer(Path(source.path))
