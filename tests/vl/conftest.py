"""Fixtures of the VL tests: the tiny checkpoint in both chat-template styles, its tokenizer, transformers'
model on it (the oracle), and an LLM whose executor is a stand-in that records what reaches the runner
(for input-side tests that need no model; the model's own tests use the real executor)."""
from pathlib import Path

import pytest

from vl_fakes import RecordingExecutor
from vl_helpers import build_tiny_vl, load_hf_model


@pytest.fixture(scope="session")
def vl_dir(tmp_path_factory) -> Path:
    return build_tiny_vl(tmp_path_factory.mktemp("tiny_vl_fd"), template="fd")


@pytest.fixture(scope="session")
def vl_dir_hf(tmp_path_factory) -> Path:
    return build_tiny_vl(tmp_path_factory.mktemp("tiny_vl_hf"), template="hf")


@pytest.fixture(scope="session")
def vl_hf_model(vl_dir):
    import torch

    torch.set_num_threads(1)
    return load_hf_model(vl_dir)


@pytest.fixture
def recording_llm(vl_dir, monkeypatch):
    """make(**LLM kwargs) -> an LLM on the tiny checkpoint with RecordingExecutor; RecordingExecutor.sent
    is emptied first."""
    import fastdeploy.engine.engine as engine_module
    from fastdeploy import LLM

    monkeypatch.setattr(engine_module, "InProcessExecutor", RecordingExecutor)
    RecordingExecutor.sent = []

    def make(model=vl_dir, **kwargs):
        kwargs.setdefault("max_model_len", 1024)
        kwargs.setdefault("num_gpu_blocks_override", 80)
        kwargs.setdefault("block_size", 16)
        return LLM(model=str(model), **kwargs)

    return make
