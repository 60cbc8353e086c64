"""Logprobs and the fields of RequestOutput end to end on the default model.

Oracles: rank and top-k properties of each logprobs dict, cumulative_logprob as the sum of the
chosen tokens' logprobs, the same numbers recomputed as prompt logprobs of the same sequence (the
prefill path), the tokenizer for decoded tokens and text, and the types FastDeploy documents.
"""
import math

import pytest

from fastdeploy import SamplingParams
from fastdeploy.engine.request import CompletionOutputs, Logprob, RequestMetrics, RequestOutput
from helpers import STORY, first, greedy, run


def check_logprobs_dict(d, token_id, k, tok):
    assert token_id in d
    assert k <= len(d) <= k + 1
    for tid, lp in d.items():
        assert isinstance(lp, Logprob) and isinstance(lp.rank, int) and lp.rank >= 1
        assert lp.logprob <= 0 and math.isfinite(lp.logprob)
        assert lp.decoded_token == tok.decode([tid])
    assert sorted(lp.rank for lp in d.values())[:k] == list(range(1, k + 1))  # the top k
    # ranks agree with the values: more likely = smaller rank
    for a in d.values():
        for b in d.values():
            if a.logprob > b.logprob + 1e-6:
                assert a.rank < b.rank


def assert_cumulative(c):
    assert isinstance(c.cumulative_logprob, float)
    total = sum(d[t].logprob for d, t in zip(c.logprobs, c.token_ids))
    assert c.cumulative_logprob == pytest.approx(total, abs=1e-4)


def test_logprobs_of_generated_tokens(smollm_llm, tok):
    out = run(smollm_llm, STORY, greedy(8, logprobs=2, ignore_eos=True))[0]
    c = out.outputs
    assert isinstance(c.logprobs, list) and len(c.logprobs) == len(c.token_ids) == 8
    for d, t in zip(c.logprobs, c.token_ids):
        check_logprobs_dict(d, t, 2, tok)
        assert d[t].rank == 1  # greedy picks the most likely token
        assert d[t].logprob == max(lp.logprob for lp in d.values())
    assert_cumulative(c)
    # the same numbers as the prompt logprobs of prompt + output (another code path: prefill)
    full = out.prompt_token_ids + c.token_ids
    again = run(smollm_llm, {"prompt_token_ids": full}, greedy(1, prompt_logprobs=0))[0]
    n = len(out.prompt_token_ids)
    for i, t in enumerate(c.token_ids):
        assert list(again.prompt_logprobs[n + i]) == [t]  # prompt_logprobs=0: the actual token only
        assert again.prompt_logprobs[n + i][t].logprob == pytest.approx(c.logprobs[i][t].logprob, abs=2e-3)
        assert again.prompt_logprobs[n + i][t].rank == 1


def test_logprobs_of_sampled_tokens_hold_the_sampled_one(smollm_llm, tok):
    c = first(smollm_llm, STORY, SamplingParams(temperature=1.5, seed=5, max_tokens=10, logprobs=2))
    assert len(c.logprobs) == len(c.token_ids)
    for d, t in zip(c.logprobs, c.token_ids):
        check_logprobs_dict(d, t, 2, tok)
        if len(d) == 3:
            assert d[t].rank > 2
    assert_cumulative(c)


def test_prompt_logprobs(smollm_llm, tok):
    out = run(smollm_llm, STORY, greedy(2, prompt_logprobs=1))[0]
    pl = out.prompt_logprobs
    assert isinstance(pl, list) and len(pl) == len(out.prompt_token_ids)
    assert pl[0] is None
    for d, t in zip(pl[1:], out.prompt_token_ids[1:]):
        check_logprobs_dict(d, t, 1, tok)
    assert out.outputs.logprobs is None and out.outputs.cumulative_logprob is None


# ---- output fields -----------------------------------------------------------------------------
def _is_opt(value, types):
    return value is None or isinstance(value, types)


def test_every_output_field_is_present_with_its_type(smollm_llm, tok):
    outs = run(smollm_llm, [STORY, "The sea is"], [greedy(6), SamplingParams(n=2, temperature=1.0, max_tokens=6)])
    for out in outs:
        assert isinstance(out, RequestOutput)
        assert isinstance(out.request_id, str) and out.request_id
        assert isinstance(out.prompt, str)
        assert isinstance(out.prompt_token_ids, list) and all(type(t) is int for t in out.prompt_token_ids)
        assert isinstance(out.outputs, CompletionOutputs)
        assert out.finished is True
        assert isinstance(out.num_cached_tokens, int) and out.num_cached_tokens >= 0
        assert out.error_code == 200 and out.error_msg is None
        assert out.prompt_logprobs is None
        for c in out.outputs:
            assert isinstance(c.index, int)
            assert isinstance(c.send_idx, int) and c.send_idx == len(c.token_ids)
            assert isinstance(c.token_ids, list) and all(type(t) is int for t in c.token_ids)
            assert isinstance(c.text, str) and c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            assert _is_opt(c.reasoning_content, str)
            assert c.finish_reason in ("stop", "length")
            assert _is_opt(c.stop_reason, (int, str))
            assert c.cumulative_logprob is None and c.logprobs is None  # not asked for
        m = out.metrics
        assert isinstance(m, RequestMetrics)
        times = [m.arrival_time, m.inference_start_time, m.first_token_time, m.time_in_queue,
                 m.model_forward_time, m.model_execute_time]
        assert all(isinstance(t, float) and t >= 0 for t in times), times
        assert m.arrival_time <= m.inference_start_time
        assert 0 < m.first_token_time <= m.model_forward_time
        assert m.model_execute_time >= m.time_in_queue
        assert m.model_execute_time >= m.model_forward_time
