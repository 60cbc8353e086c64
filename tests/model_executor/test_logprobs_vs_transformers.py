"""Logprobs on the default model against transformers' log_softmax on the same weights.

Oracle: transformers' LlamaForCausalLM on the same GGUF (float32), run once over prompt + our
generated tokens; log_softmax of its logits at each position. Our raw logprobs (the default
`logprobs_mode`) must match within 1e-4 for the generated tokens, their top-k, and every prompt
token (`prompt_logprobs`).
"""
import numpy as np
import torch

from fastdeploy import SamplingParams

TOL = 1e-4
K = 5
PROMPTS = [
    "The three primary colors are",
    "def fibonacci(n):\n    ",
    "长城位于",
]


def reference_logprobs(hf, ids: list[int]) -> np.ndarray:
    """[len(ids), vocab] log_softmax of transformers' logits; row i scores token i + 1."""
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1).numpy()


def test_generated_and_prompt_logprobs_match_transformers(smollm_llm, smollm_hf):
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=K, prompt_logprobs=K)
    outputs = smollm_llm.generate(PROMPTS, params, use_tqdm=False)
    for out in outputs:
        prompt, generated = out.prompt_token_ids, out.outputs.token_ids
        ref = reference_logprobs(smollm_hf, prompt + generated)
        assert len(out.outputs.logprobs) == len(generated)
        for i, (token, entry) in enumerate(zip(generated, out.outputs.logprobs)):
            row = ref[len(prompt) - 1 + i]
            assert abs(entry[token].logprob - row[token]) < TOL
            assert entry[token].rank == 1  # greedy: the argmax
            top = np.argsort(-row, kind="stable")[:K]
            for t in top:
                if row[top[0]] - row[t] > 1e-3 and row[t] - row[top[-1]] > 1e-3:  # not a near-tie at the edges
                    assert int(t) in entry, f"token {t} of transformers' top-{K} missing at step {i}"
            for t, lp in entry.items():
                assert abs(lp.logprob - row[t]) < TOL
                # rank = 1 + tokens strictly more likely; tokens within TOL of t may fall either side
                assert 1 + (row > row[t] + TOL).sum() <= lp.rank <= 1 + (row > row[t] - TOL).sum()
        assert abs(out.outputs.cumulative_logprob - sum(ref[len(prompt) - 1 + i][t] for i, t in enumerate(generated))) < TOL * len(generated)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        for position in range(1, len(prompt)):
            entry, row = out.prompt_logprobs[position], ref[position - 1]
            token = prompt[position]
            assert abs(entry[token].logprob - row[token]) < TOL
            assert len(entry) in (K, K + 1)
            for t, lp in entry.items():
                assert abs(lp.logprob - row[t]) < TOL
                assert 1 + (row > row[t] + TOL).sum() <= lp.rank <= 1 + (row > row[t] - TOL).sum()
