"""A draft model that cannot serve the target is a ValueError naming why, before anything runs; a
different draft (another tiny model, same tokenizer) leaves the target's greedy tokens unchanged."""
import json

import pytest

from fastdeploy import LLM, SamplingParams
from tiny_llama import make_tiny_llama


@pytest.fixture(scope="module")
def target_and_draft(tmp_path_factory):
    target, draft = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("draft")
    make_tiny_llama(target, seed=0)
    make_tiny_llama(draft, seed=1)
    return str(target), str(draft)


def test_other_draft_keeps_greedy_tokens(target_and_draft):
    target, draft = target_and_draft
    prompts = [{"prompt_token_ids": [5 + i, 40, 41, 42, 40, 41, 9 * i + 3]} for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    plain = LLM(model=target, max_model_len=128)
    reference = plain.generate(prompts, params, use_tqdm=False)
    plain.shutdown()
    llm = LLM(model=target, max_model_len=128,
              speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": 4})
    outs = llm.generate(prompts, params, use_tqdm=False)
    llm.shutdown()
    from helpers import assert_same_greedy, top2_gaps

    for out, ref in zip(outs, reference):
        assert_same_greedy(out.outputs.token_ids, ref.outputs.token_ids, top2_gaps(ref.outputs))
    assert sum(o.metrics.num_draft_tokens for o in outs) > 0


def test_draft_with_another_tokenizer(target_and_draft, tmp_path):
    target, draft = target_and_draft
    vocab_path = tmp_path / "draft"
    import shutil

    shutil.copytree(draft, vocab_path)
    tok = json.loads((vocab_path / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    first = next(iter(vocab))
    vocab[first + "_renamed"] = vocab.pop(first)
    (vocab_path / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        LLM(model=target, speculative_config={"method": "draft_model", "model": str(vocab_path),
                                              "num_speculative_tokens": 2})


def test_draft_with_too_few_positions(target_and_draft):
    target, draft = target_and_draft
    with pytest.raises(ValueError, match="positions"):
        LLM(model=target, max_model_len=510,
            speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": 4})


def test_missing_draft_checkpoint(target_and_draft, tmp_path):
    target, _ = target_and_draft
    with pytest.raises((ValueError, FileNotFoundError), match="nowhere"):
        LLM(model=target, speculative_config={"method": "draft_model", "model": str(tmp_path / "nowhere"),
                                              "num_speculative_tokens": 2})
