"""ERNIE-4.5 tokenizer fixtures shared by the tokenizer tests of this folder: the sentencepiece model
trained once per module (tokenizer_dirs.py), sentencepiece itself on it (the oracle), a model
directory in each tokenizer_config.json layout, and the tokenizer load_model_tokenizer reads from it.
"""
from pathlib import Path

import pytest

from fastdeploy.input.tokenizer_loader import load_model_tokenizer

from tokenizer_dirs import train_sentencepiece, write_ernie_tokenizer


@pytest.fixture(scope="module")
def ernie_spm() -> bytes:
    return train_sentencepiece()


@pytest.fixture(scope="module")
def sp(ernie_spm):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=ernie_spm)


@pytest.fixture(scope="module", params=["inline", "jinja"])
def ernie_dir(request, ernie_spm, tmp_path_factory) -> Path:
    return write_ernie_tokenizer(tmp_path_factory.mktemp(f"ernie_{request.param}"), ernie_spm, request.param)


@pytest.fixture(scope="module")
def ernie_tok(ernie_dir):
    return load_model_tokenizer(ernie_dir)
