"""The speculation policy on its own: the row cap, max_tokens, the pause after low acceptance and the
retry after it, against the rules spelled out in spec_decode/policy.py."""
from fastdeploy.config import SpeculativeConfig
from fastdeploy.engine.request import Request
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.spec_decode import policy
from fastdeploy.spec_decode.policy import SpeculationPolicy


def request(max_tokens=100, generated=0) -> Request:
    r = Request("r", [1, 2, 3], SamplingParams(max_tokens=max_tokens), None)
    r.output_token_ids = [7] * generated
    r.spec_token_ids = [4, 5, 6, 7]
    return r


def make(limit=None) -> SpeculationPolicy:
    return SpeculationPolicy(SpeculativeConfig.from_dict(
        {"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": limit}))


def test_batch_size_and_row_cap():
    assert make(4).step_is_on(4) and not make(4).step_is_on(5)
    assert make().step_is_on(10_000)
    p = make()
    assert p.draft_rows(1) == policy.MAX_VERIFY_ROWS - 1
    assert p.draft_rows(policy.MAX_VERIFY_ROWS) == 0 and p.draft_rows(40) == 0


def test_drafts_fit_budget_max_tokens_and_the_limit():
    p = make()
    assert p.drafts(request(), budget=10) == [4, 5]  # FIRST_LIMIT
    r = request()
    p.record(r, 2, 2)  # all accepted: the limit doubles
    assert p.drafts(r, budget=10) == [4, 5, 6, 7]
    assert p.drafts(r, budget=3) == [4, 5, 6]
    r.output_token_ids = [7] * 97  # max_tokens 100: 3 tokens left, 2 drafts + 1
    assert p.drafts(r, budget=10) == [4, 5]
    r.output_token_ids = [7] * 99
    assert p.drafts(r, budget=10) == []
    r.output_token_ids = []
    p.record(r, 4, 1)  # one accepted: next time one more than that
    assert p.drafts(r, budget=10) == [4, 5]
    p.record(r, 2, 0)
    assert p.drafts(r, budget=10) == [4]


def test_pause_after_low_acceptance_then_retry():
    p, r = make(), request()
    for _ in range(3):  # 12 drafted, 1 accepted: the window (16) is not full yet
        p.record(r, 4, 0 if _ else 1)
    assert p.may_speculate(r) and p.drafts(r, 10) == [4]
    p.record(r, 4, 0)  # 16 drafted, 1 accepted < 20%
    assert not p.may_speculate(r) and r.spec_token_ids == []
    for _ in range(policy.PAUSE):
        r.spec_token_ids = [4, 5]
        assert p.drafts(r, 10) == []  # each decode step counts towards the pause
    assert p.may_speculate(r) and p.drafts(r, 10) == [4]


def test_good_acceptance_keeps_speculating():
    p, r = make(), request()
    for _ in range(20):
        p.record(r, 4, 1)  # 25% accepted
    assert p.may_speculate(r)
