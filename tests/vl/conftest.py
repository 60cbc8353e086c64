"""Fixtures of the VL tests: the tiny checkpoint in both chat-template styles, its tokenizer, transformers'
model on it (the oracle), and an LLM whose executor is a stand-in that records what reaches the runner
(for input-side tests that need no model; the model's own tests use the real executor)."""
from pathlib import Path

import numpy as np
import pytest

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


class RecordingExecutor:
    """Executor stand-in: answers every sampling position with token `TOKEN` and records each
    NewRequestData it is sent (the runner's view of a request)."""

    TOKEN = 40
    sent: list = []

    def __init__(self, config, weights, quant_config=None):
        self.totals: dict[str, list[int]] = {}  # req_id -> [tokens in the sequence, tokens computed]

    def execute_model(self, scheduler_output):
        from fastdeploy.worker.output import ModelRunnerOutput

        for req_id in scheduler_output.finished_req_ids | scheduler_output.preempted_req_ids:
            self.totals.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            RecordingExecutor.sent.append(new)
            self.totals[new.req_id] = [len(new.prompt_token_ids) + len(new.output_token_ids), new.num_computed_tokens]
        for cached in scheduler_output.scheduled_cached_reqs:
            self.totals[cached.req_id][1] = cached.num_computed_tokens
        sampled = {}
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            state = self.totals[req_id]
            state[1] += n
            if state[1] == state[0]:
                sampled[req_id] = self.TOKEN
                state[0] += 1
        return ModelRunnerOutput(sampled_token_ids=sampled)

    def check_health(self):
        pass

    def shutdown(self):
        pass


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


def random_image(height, width, seed=0):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))
