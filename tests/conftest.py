"""Shared fixtures: the default model (our engine and the transformers oracle), its tokenizer, and
live greedy runs that several end-to-end tests read their expectations from."""
import os
from types import SimpleNamespace

import fastdeploy  # noqa: F401  (first: sets the MKL fix before paddle is imported)
import pytest

from fastdeploy.model_executor.model_loader.model_path import default_model_path

# conversations, one of which must end by itself (EOS) soon under greedy: see chat_eos
SHORT_CHATS = [[{"role": "user", "content": q}] for q in
               ("Reply with one word: yes or no?", "Say OK.", "Name a fruit.", "Name a color.")]


@pytest.fixture(scope="session")
def smollm_path() -> str:
    return default_model_path()


@pytest.fixture(scope="session")
def smollm_llm(smollm_path):
    """Our engine on the default model, shared by tests that only read from it."""
    from fastdeploy import LLM
    from helpers import SMOLLM_BLOCK_SIZE, SMOLLM_MAX_MODEL_LEN

    return LLM(model=smollm_path, max_model_len=SMOLLM_MAX_MODEL_LEN, block_size=SMOLLM_BLOCK_SIZE,
               max_num_seqs=16)


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


@pytest.fixture(scope="session")
def tok(smollm_llm):
    return smollm_llm.get_tokenizer()


@pytest.fixture(scope="session")
def story(smollm_llm):
    """The unstopped greedy continuation of helpers.STORY (STORY_TOKENS tokens, EOS ignored)."""
    from helpers import STORY, STORY_TOKENS, first, story_params

    out = first(smollm_llm, STORY, story_params())
    assert out.finish_reason == "length" and len(out.token_ids) == STORY_TOKENS
    return out


@pytest.fixture(scope="session")
def chat_eos(smollm_llm, tok):
    """The shortest greedy answer among SHORT_CHATS that ends by itself with the tokenizer's EOS
    within 32 tokens: SimpleNamespace(conv, out, eos, eos_text)."""
    from helpers import chat, greedy

    outs = chat(smollm_llm, SHORT_CHATS, greedy(32))
    ended = [(len(o.outputs.token_ids), i) for i, o in enumerate(outs) if o.outputs.finish_reason == "stop"]
    assert ended, "no conversation ended by itself within 32 tokens"
    i = min(ended)[1]
    out = outs[i].outputs
    assert out.stop_reason is None and out.token_ids[-1] == tok.eos_token_id
    return SimpleNamespace(conv=SHORT_CHATS[i], out=out, eos=tok.eos_token_id,
                           eos_text=tok.decode([tok.eos_token_id]))


@pytest.fixture
def preemptions(monkeypatch):
    """Counts Scheduler._preempt calls: [count], read after the run."""
    from fastdeploy.engine.sched.scheduler import Scheduler

    count = [0]
    original = Scheduler._preempt

    def counting(self, request):
        count[0] += 1
        return original(self, request)

    monkeypatch.setattr(Scheduler, "_preempt", counting)
    return count
