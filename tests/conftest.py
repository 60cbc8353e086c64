"""Shared fixtures: the default model (our engine and the transformers oracle) and tiny checkpoints."""
import os

import fastdeploy  # noqa: F401  (first: sets the MKL fix before paddle is imported)
import pytest

from fastdeploy.model_executor.model_loader.model_path import default_model_path


@pytest.fixture(scope="session")
def smollm_path() -> str:
    return default_model_path()


@pytest.fixture(scope="session")
def smollm_llm(smollm_path):
    """Our engine on the default model, shared by tests that only read from it."""
    from fastdeploy import LLM

    return LLM(model=smollm_path, max_model_len=1024, max_num_seqs=16)


@pytest.fixture(scope="session")
def smollm_hf(smollm_path):
    """transformers' LlamaForCausalLM on the same GGUF, dequantized to float32 (the oracle)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # a stable oracle while the engine under test uses the other cores
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(smollm_path), gguf_file=os.path.basename(smollm_path), dtype=torch.float32
    )
    return model.eval()
