"""logit_bias and allowed_token_ids (vLLM's fields) in the sampler, against numpy reference formulas:
the processed logits bit for bit, their place in the order (penalties -> logit_bias -> logits
processors -> bans -> temperature), and the statistics of draws under a bias.

End-to-end checks on the default model (SamplingParams through LLM.generate) are at the bottom.
"""
import math

import numpy as np
import paddle
import pytest

from fastdeploy import SamplingParams
from fastdeploy.model_executor.layers.sample.allowed_tokens import disallowed_mask
from fastdeploy.model_executor.layers.sample.logit_bias import LogitBias, bias_arrays
from fastdeploy.model_executor.layers.sample.penalties import PenaltyInputs
from fastdeploy.model_executor.layers.sample.sampler import SamplingMetadata, sample
from helpers import assert_same_greedy, first, greedy, run, top2_gaps

VOCAB = 1000


def metadata(rows, temperature=0.0, **kwargs) -> SamplingMetadata:
    return SamplingMetadata(temperature=np.full(rows, temperature), top_k=np.zeros(rows, np.int64),
                            top_p=np.ones(rows), min_p=np.zeros(rows),
                            uniforms=np.random.default_rng(0).random(rows), banned=kwargs.pop("banned", []), **kwargs)


def bias_of(per_row: dict) -> LogitBias:
    return LogitBias.from_rows([(row, *bias_arrays(b)) for row, b in per_row.items()])


# ---- SamplingParams fields ----------------------------------------------------------------------
def test_logit_bias_keys_become_ints_and_values_are_clamped():
    params = SamplingParams(logit_bias={"7": 2.5, 3: 250, 4: -1e9, 5: -math.inf, 6: 10**400})
    assert params.logit_bias == {7: 2.5, 3: 100.0, 4: -100.0, 5: -100.0, 6: 100.0}
    assert all(type(k) is int for k in params.logit_bias)
    assert SamplingParams(logit_bias={}).logit_bias == {}


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(logit_bias=[(1, 2.0)]), TypeError, r"logit_bias must be a dict"),
    (dict(logit_bias={"seven": 1.0}), ValueError, r"logit_bias keys .*'seven'"),
    (dict(logit_bias={None: 1.0}), TypeError, r"logit_bias keys .*None"),
    (dict(logit_bias={1.5: 1.0}), TypeError, r"logit_bias keys .*1.5"),
    (dict(logit_bias={-1: 1.0}), ValueError, r"logit_bias keys must be token ids >= 0, got -1"),
    (dict(logit_bias={3: "high"}), TypeError, r"logit_bias value of 3 must be a number, got 'high'"),
    (dict(logit_bias={3: True}), TypeError, r"logit_bias value of 3 must be a number"),
    (dict(logit_bias={3: math.nan}), ValueError, r"logit_bias value of 3 must be a number, got nan"),
    (dict(allowed_token_ids=[]), ValueError, r"allowed_token_ids must not be empty"),
    (dict(allowed_token_ids=[1, -2]), TypeError, r"allowed_token_ids must be a list of token ids"),
    (dict(allowed_token_ids=5), TypeError, r"allowed_token_ids must be a list of token ids"),
    (dict(logits_processors_args=[("logit_bias", {})]), TypeError, r"logits_processors_args must be a dict"),
])
def test_bad_values_name_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        SamplingParams(**kwargs)


# ---- the processed logits, bit for bit ----------------------------------------------------------
def test_bias_and_allowed_tokens_match_the_numpy_reference_bit_for_bit():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, (4, VOCAB)).astype(np.float32)
    biases = {0: {5: 2.5, 17: -100.0, 999: 0.125}, 2: {5: 100.0, 0: -0.3}}  # row 1, 3: no bias
    allowed = {1: [3, 700, 12], 2: [5, 6, 0]}  # row 0, 3: no list
    expected = x.copy()
    for row, b in biases.items():
        for token, value in b.items():
            expected[row, token] = np.float32(expected[row, token] + np.float32(value))
    for row, ids in allowed.items():
        outside = np.setdiff1d(np.arange(VOCAB), ids)
        expected[row, outside] = -np.inf
    md = metadata(4, logit_bias=bias_of(biases),
                  allowed=[(row, disallowed_mask(ids, VOCAB)) for row, ids in allowed.items()])
    tokens = sample(x, md).token_ids  # x processed in place
    np.testing.assert_array_equal(x, expected)
    assert (tokens == expected.argmax(axis=1)).all()
    assert tokens[1] in allowed[1] and tokens[2] == 5


def test_rows_without_bias_or_list_are_untouched():
    x = np.random.default_rng(2).normal(size=(3, VOCAB)).astype(np.float32)
    before = x.copy()
    sample(x, metadata(3, logit_bias=bias_of({1: {4: 1.0}}), allowed=[(1, disallowed_mask([4], VOCAB))]))
    np.testing.assert_array_equal(x[[0, 2]], before[[0, 2]])
    assert LogitBias.from_rows([(0, *bias_arrays({}))]) is None  # an empty dict costs nothing


# ---- the order -------------------------------------------------------------------------------------
class Recorder:
    """A logits processor that keeps a copy of the logits it is given."""

    def __init__(self):
        self.seen = None

    def update_state(self, rows):
        pass

    def apply(self, logits):
        self.seen = logits.copy()


def test_order_penalties_then_bias_then_processors_then_bans_then_temperature():
    rng = np.random.default_rng(3)
    x0 = rng.normal(0, 2, (2, VOCAB)).astype(np.float32)
    x0[:, 10] = 4.0  # positive: repetition divides it
    r, b, t = np.float32(2.0), np.float32(3.0), 0.7
    penalties = PenaltyInputs(rows=np.array([0, 1]), token_ids=np.array([10, 10]), output_counts=np.zeros(2, np.float32),
                              repetition=np.full(2, r), frequency=np.zeros(2, np.float32),
                              presence=np.zeros(2, np.float32))
    recorder = Recorder()
    md = metadata(2, temperature=t, penalties=penalties, logit_bias=bias_of({0: {10: 3.0}, 1: {10: 3.0}}),
                  logits_processors=[recorder], banned=[(0, [11])], allowed=[(1, disallowed_mask([10, 20], VOCAB))],
                  num_logprobs=np.array([VOCAB, VOCAB]), logprobs_mode="processed_logprobs")
    x = x0.copy()
    out = sample(x, md)
    # the processor saw penalised, then biased logits: 4 / 2 + 3 (bias first would give (4 + 3) / 2)
    assert recorder.seen[0, 10] == recorder.seen[1, 10] == np.float32(4.0 / r + b)
    # ... and no bans yet
    assert np.isfinite(recorder.seen).all()
    expected = recorder.seen.copy()
    expected[0, 11] = -np.inf
    expected[1, np.setdiff1d(np.arange(VOCAB), [10, 20])] = -np.inf
    np.testing.assert_array_equal(x, expected)  # bans applied after the processors, nothing else changed
    # temperature comes after all of it: processed logprobs are log_softmax(expected / t)
    for row in range(2):
        z = expected[row].astype(np.float64) / t
        ref = z - z.max() - np.log(np.exp(z - z.max()).sum())
        got = dict(zip(out.logprobs[row].top_ids[0].tolist(), out.logprobs[row].top_logprobs[0].tolist()))
        finite = np.flatnonzero(np.isfinite(ref))
        np.testing.assert_allclose([got[int(i)] for i in finite], ref[finite], atol=1e-5)


def test_raw_logprobs_are_taken_before_the_bias():
    x0 = np.random.default_rng(4).normal(size=(1, VOCAB)).astype(np.float32)
    md = metadata(1, logit_bias=bias_of({0: {7: 50.0}}), num_logprobs=np.array([1]))
    out = sample(x0.copy(), md)
    z = x0[0].astype(np.float64)
    ref = z - z.max() - np.log(np.exp(z - z.max()).sum())
    assert out.token_ids[0] == 7
    assert out.logprobs[0].token_logprobs[0] == pytest.approx(ref[7], abs=1e-5)


# ---- statistics of draws under a bias --------------------------------------------------------------
LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], dtype=np.float32)
DRAWS = 6000


def draws_under(bias: dict, temperature=1.0, seed=0) -> np.ndarray:
    md = metadata(DRAWS, temperature=temperature, logit_bias=bias_of({r: bias for r in range(DRAWS)}))
    md.uniforms = np.random.default_rng(seed).random(DRAWS)
    return sample(paddle.to_tensor(np.tile(LOGITS, (DRAWS, 1))), md).token_ids


def test_plus_100_is_always_drawn_and_minus_100_never():
    assert (draws_under({7: 100.0}) == 7).all()  # the least likely token
    assert not (draws_under({0: -100.0}, seed=1) == 0).any()  # the most likely one


@pytest.mark.parametrize("token, bias, temperature", [(3, 1.5, 1.0), (0, -2.0, 1.0), (6, 2.0, 0.5)])
def test_a_moderate_bias_shifts_frequencies_as_softmax_predicts(token, bias, temperature):
    z = LOGITS.astype(np.float64)
    z[token] += bias
    p = np.exp((z - z.max()) / temperature)
    p /= p.sum()
    counts = np.bincount(draws_under({token: bias}, temperature, seed=token), minlength=len(LOGITS))
    std = np.sqrt(DRAWS * p * (1 - p))  # binomial
    assert (np.abs(counts - DRAWS * p) < 4.5 * std + 1).all(), (counts, DRAWS * p)
    unbiased = np.exp((LOGITS - LOGITS.max()) / temperature)
    assert abs(p[token] - unbiased[token] / unbiased.sum()) > 10 * std[token] / DRAWS  # the shift is measurable


# ---- end to end on the default model -------------------------------------------------------------
PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):"]


def test_a_plus_100_bias_forces_the_token_in_greedy_and_sampled_runs(smollm_llm, tok):
    target = tok.encode(" banana", add_special_tokens=False)[0]
    for params in (greedy(6, logit_bias={target: 100}), SamplingParams(temperature=1.0, n=2, seed=5, max_tokens=6,
                                                                     logit_bias={str(target): 100.0})):
        for c in run(smollm_llm, PROMPTS[:1], params)[0].outputs:
            assert c.token_ids == [target] * 6


def test_allowed_token_ids_bound_every_generated_token(smollm_llm, tok):
    allowed = sorted({t for w in (" yes", " no", " maybe", ".", "!") for t in tok.encode(w, add_special_tokens=False)})
    outs = run(smollm_llm, PROMPTS, [greedy(8, allowed_token_ids=allowed),
                                     SamplingParams(temperature=1.0, n=3, seed=2, max_tokens=8, allowed_token_ids=allowed),
                                     SamplingParams(temperature=1.5, max_tokens=8, allowed_token_ids=allowed)])
    completions = [c for o in outs for c in o.outputs]
    assert len(completions) == 5
    for c in completions:
        assert len(c.token_ids) == 8 and set(c.token_ids) <= set(allowed)  # EOS not listed: runs to max_tokens
    assert len({t for c in completions for t in c.token_ids}) > 1


@pytest.mark.parametrize("kwargs, field", [
    (dict(logit_bias={49152: 1.0}), r"logit_bias holds token id 49152"),
    (dict(allowed_token_ids=[5, 10**6]), r"allowed_token_ids holds token id 1000000"),
])
def test_ids_outside_the_vocabulary_name_the_prompt(smollm_llm, kwargs, field):
    with pytest.raises(ValueError, match=rf"prompt 2: {field}, outside the vocabulary \[0, 49152\)"):
        run(smollm_llm, PROMPTS, [greedy(2), greedy(2), greedy(2, **kwargs)])
    assert not smollm_llm.llm_engine.has_unfinished_requests()  # nothing of the call was queued


def test_requests_without_them_get_the_same_tokens_in_a_mixed_batch(smollm_llm, tok):
    target = tok.encode(" banana", add_special_tokens=False)[0]
    plain = greedy(10, ignore_eos=True, logprobs=2)
    alone = [first(smollm_llm, p, plain) for p in PROMPTS]
    mixed = run(smollm_llm, PROMPTS + PROMPTS[:2], [plain] * 3 + [
        greedy(10, ignore_eos=True, logit_bias={target: 8.0}),
        greedy(10, ignore_eos=True, allowed_token_ids=[target, 13, 30])])
    for ref, out in zip(alone, mixed[:3]):
        assert_same_greedy(out.outputs.token_ids, ref.token_ids, top2_gaps(ref), "mixed batch")
    assert set(mixed[4].outputs.token_ids) <= {target, 13, 30}
