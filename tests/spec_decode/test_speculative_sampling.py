"""Sampled outputs under speculative decoding keep the target distribution.

A tiny random Llama continues a prompt under top-k sampling, drafts being accepted about half the
time, so every kind of verified row (the last token's, an accepted draft's, the bonus) emits tokens:
- ngram: a logit_bias puts most of the mass on two tokens A and B, in proportions that change with
  every position, and the prompt alternates A and B, so n-gram lookup proposes the alternation;
- draft_model: the model drafts for itself, its greedy choice accepted as often as the sample
  agrees with it.
Each emitted token is compared, by a chi-square test pooled over the prefixes seen often enough, with
the next-token distribution transformers computes from the same weights (the bias added, top-k
kept, renormalised).
"""
import numpy as np
import pytest
import torch
from scipy.stats import chi2

from fastdeploy import LLM, SamplingParams
from tiny_llama import make_tiny_llama

A, B = 300, 301
PROMPT = [5, 17, A, B, A, B, A, B, A, B, 42, A, B, A]
BIAS = {A: 9.0, B: 9.0}
TOP_K = 3
SAMPLES = 3000
TOKENS = 5
MIN_COUNT = 60  # prefixes seen at least this often are tested


def target_distribution(model, prefix: list[int], bias: dict) -> dict[int, float]:
    """The next-token distribution of PROMPT + prefix as the sampler should draw it (temperature 1)."""
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + prefix])).logits[0, -1].double().numpy()
    for token, value in bias.items():
        logits[token] += value
    top = np.argsort(-logits)[:TOP_K]
    p = np.exp(logits[top] - logits[top].max())
    return dict(zip(top.tolist(), (p / p.sum()).tolist()))


def chi_square(counts: dict[int, int], expected: dict[int, float]) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom of observed counts against probabilities."""
    total = sum(counts.values())
    assert set(counts) <= set(expected), f"drew {set(counts) - set(expected)} outside the top-{TOP_K}"
    stat = sum((counts.get(t, 0) - total * p) ** 2 / (total * p) for t, p in expected.items())
    return stat, len(expected) - 1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_spec")
    return path, make_tiny_llama(path, seed=3)


SPECS = {  # method: (speculative_config, logit_bias)
    "ngram": ({"method": "ngram", "num_speculative_tokens": 3, "min_ngram_size": 1, "max_ngram_size": 2}, BIAS),
    "draft_model": ({"method": "draft_model", "num_speculative_tokens": 3}, {}),
}


@pytest.mark.parametrize("method", SPECS)
def test_sampled_tokens_keep_the_target_distribution(tiny, method):
    path, model = tiny
    spec, bias = SPECS[method]
    spec = {**spec, **({"model": str(path)} if method == "draft_model" else {})}
    llm = LLM(model=str(path), max_model_len=64, seed=0, max_num_seqs=4, speculative_config=spec)
    try:
        params = SamplingParams(temperature=1.0, top_k=TOP_K, logit_bias=bias or None, max_tokens=TOKENS, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": PROMPT}] * SAMPLES, params, use_tqdm=False)
    finally:
        llm.shutdown()
    drafted = sum(o.metrics.num_draft_tokens for o in outs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outs)
    assert 0.2 * drafted < accepted < 0.9 * drafted, (accepted, drafted)  # both outcomes are common
    by_prefix: dict[tuple, dict[int, int]] = {}
    for out in outs:
        tokens = out.outputs.token_ids
        for i, token in enumerate(tokens):
            counts = by_prefix.setdefault(tuple(tokens[:i]), {})
            counts[token] = counts.get(token, 0) + 1
    stat, dof, tested = 0.0, 0, 0
    for prefix, counts in by_prefix.items():
        if sum(counts.values()) >= MIN_COUNT:
            s, d = chi_square(counts, target_distribution(model, list(prefix), bias))
            stat, dof, tested = stat + s, dof + d, tested + 1
    assert tested >= 20
    assert chi2.sf(stat, dof) > 1e-3, f"chi-square {stat:.1f} on {dof} degrees of freedom over {tested} prefixes"
