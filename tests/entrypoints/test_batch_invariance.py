"""The real batch-composition guarantee (docs/design.md, Invariants): a prompt gets the same greedy
tokens alone or in a batch unless its top-2 logits are within float noise (a near-tie), and its
logprobs agree to float rounding. The batch changes the matmul paths a step takes: one row alone
against 16 rows per decode step, a short prefill against one of hundreds of rows."""
import numpy as np

from helpers import assert_same_greedy, run, top2_gaps

from fastdeploy import SamplingParams

LOGPROB_TOLERANCE = 1e-3  # float32 rounding differences between summation orders, far above ~1e-6


def test_alone_or_in_a_batch_same_tokens_up_to_near_ties(smollm_llm):
    rng = np.random.default_rng(5)
    target = [int(t) for t in rng.integers(200, 40000, size=9)]
    others = [[int(t) for t in rng.integers(200, 40000, size=int(rng.integers(20, 90)))] for _ in range(15)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)
    smollm_llm.reset_prefix_cache()
    alone = run(smollm_llm, [target], params)[0].outputs
    smollm_llm.reset_prefix_cache()
    batched = run(smollm_llm, others[:7] + [target] + others[7:], params)[7].outputs
    assert_same_greedy(batched.token_ids, alone.token_ids, top2_gaps(alone), "batched vs alone:")
    for i, (a, b) in enumerate(zip(alone.token_ids, batched.token_ids)):
        if a != b:
            break
        assert abs(alone.logprobs[i][a].logprob - batched.logprobs[i][b].logprob) < LOGPROB_TOLERANCE, i
