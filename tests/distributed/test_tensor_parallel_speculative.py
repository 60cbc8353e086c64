"""Speculative decoding under tensor parallelism: rank 0 verifies (and, for a draft model, drafts)
and every rank keeps the same tokens; the tokens are those of one process without speculation."""
import pytest

from fastdeploy import LLM, SamplingParams
from helpers import SMOLLM_BLOCK_SIZE, SMOLLM_MAX_MODEL_LEN, assert_same_greedy, top2_gaps

# prompts that repeat themselves, so drafts are proposed and accepted
PROMPTS = ["one two three four five one two three four five one two three",
           "The cat sat on the mat. The cat sat on the mat. The cat",
           "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"]
SPECS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4},
    "draft_model": {"method": "draft_model", "num_speculative_tokens": 3},  # the default model as its draft
}


@pytest.mark.parametrize("method", SPECS)
def test_speculation_on_two_ranks_keeps_the_tokens(smollm_llm, smollm_path, method):
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2)
    ref = [o.outputs[0] for o in smollm_llm.generate(PROMPTS, params, use_tqdm=False)]
    spec = {**SPECS[method], **({"model": smollm_path} if method == "draft_model" else {})}
    llm = LLM(model=smollm_path, tensor_parallel_size=2, max_model_len=SMOLLM_MAX_MODEL_LEN,
              block_size=SMOLLM_BLOCK_SIZE, max_num_seqs=16, speculative_config=spec)
    try:
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        for i, (out, theirs) in enumerate(zip(outs, ref)):
            assert_same_greedy(out.outputs[0].token_ids, theirs.token_ids, top2_gaps(theirs), f"prompt {i}")
        assert sum(o.metrics.num_accepted_tokens for o in outs) > 0
        seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=16, ignore_eos=True)
        ours = llm.generate(PROMPTS, seeded, use_tqdm=False)
        theirs = smollm_llm.generate(PROMPTS, seeded, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in ours] == [o.outputs[0].token_ids for o in theirs]
    finally:
        llm.shutdown()
