"""Our Llama against transformers' LlamaForCausalLM on tiny random checkpoints with identical weights.

Oracle: transformers 5 (torch CPU, float32). Logits at every position of a ragged batch of prompts
of different lengths must match within 1e-4 (max abs), and greedy generation through LLM.generate
must give the same tokens as transformers' generate.
"""
import numpy as np
import pytest
import torch

from fastdeploy import LLM, SamplingParams

from runner_access import forward_logits
from tiny_llama import VOCAB_SIZE, make_tiny_llama

PROMPT_LENGTHS = [1, 7, 64, 65, 130, 300]  # around block boundaries of block_size 64; 300 is a long prefill


def our_prefill_logits(llm: LLM, prompts: list[list[int]]) -> list[np.ndarray]:
    """Logits at every position of every prompt, computed in one ragged prefill step."""
    engine = llm.llm_engine
    block_size = engine.config.cache_config.block_size
    tables = [engine.block_pool.allocate(-(-len(p) // block_size)) for p in prompts]
    try:
        logits = forward_logits(llm, prompts, tables, history=0)
    finally:
        for t in tables:
            engine.block_pool.free(t)
    bounds = np.cumsum([0] + [len(p) for p in prompts])
    return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize(
    "tie,rope_style,shard",
    [(False, "rope_parameters", "1GB"), (True, "top_level", "1GB"), (False, "rope_scaling", "100KB")],
)
def test_logits_and_greedy_match_transformers(tmp_path, tie, rope_style, shard, attention_impl):
    hf = make_tiny_llama(tmp_path, tie=tie, rope_style=rope_style, max_shard_size=shard)
    assert (tmp_path / "model.safetensors.index.json").exists() == (shard == "100KB")
    llm = LLM(model=str(tmp_path), max_model_len=512, num_gpu_blocks_override=64)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, VOCAB_SIZE, size=n).tolist() for n in PROMPT_LENGTHS]

    ours = our_prefill_logits(llm, prompts)
    for prompt, logits in zip(prompts, ours):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0].numpy()
        assert np.abs(logits - ref).max() <= 1e-4

    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    outputs = llm.generate(prompts[1:], params, use_tqdm=False)
    for prompt, output in zip(prompts[1:], outputs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=32, min_new_tokens=32)
        assert output.outputs.token_ids == ref[0, len(prompt):].tolist()
    assert len(set(t for o in outputs for t in o.outputs.token_ids)) > 4  # continuations vary


def test_model_name_resolves_from_local_hf_cache(tmp_path, monkeypatch):
    """A name that is not a path is found in the HF cache layout (refs/main -> snapshot), offline."""
    snapshot = tmp_path / "hub" / "models--tiny-org--tiny-llama" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    hf = make_tiny_llama(snapshot)
    (tmp_path / "hub" / "models--tiny-org--tiny-llama" / "refs").mkdir()
    (tmp_path / "hub" / "models--tiny-org--tiny-llama" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    llm = LLM(model="tiny-org/tiny-llama", max_model_len=256, num_gpu_blocks_override=8)
    prompt = [5, 17, 300, 42]
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8, min_new_tokens=8)
    assert out.outputs.token_ids == ref[0, len(prompt):].tolist()


def test_chunked_prefill_gives_the_same_greedy_tokens(tmp_path, attention_impl):
    """Prompts split over many steps (history + multi-token queries, mixed with decodes)."""
    hf = make_tiny_llama(tmp_path)
    llm = LLM(model=str(tmp_path), max_model_len=512, num_gpu_blocks_override=64,
              enable_chunked_prefill=True, max_num_batched_tokens=48)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, VOCAB_SIZE, size=n).tolist() for n in (5, 100, 33, 290)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=16, min_new_tokens=16)
        assert output.outputs.token_ids == ref[0, len(prompt):].tolist()
