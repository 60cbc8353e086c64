"""Penalties and bans of the sampling layer, and the sampler end to end, against the dense numpy
references of penalty_batches.py (its docstring lists the semantics).
"""
from collections import Counter
from types import SimpleNamespace

import fastdeploy  # noqa: F401  (before paddle)
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.sample import penalties
from fastdeploy.model_executor.layers.sample.sampler import SamplingMetadata, sample
from fastdeploy.worker.sampling_inputs import penalty_inputs

from penalty_batches import ROWS, SEEDS, VOCAB, banned_pairs, log_softmax, make_requests, reference_processed


# ---- seen_tokens / penalties / bans -----------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_seen_tokens_lists_each_token_once_with_its_output_count(seed):
    for request in make_requests(seed)[0]:
        ids, counts = penalties.seen_tokens(np.unique(request.prompt_token_ids), request.output_token_ids)
        expected = Counter(request.output_token_ids)
        for t in request.prompt_token_ids:
            expected.setdefault(t, 0)
        assert len(ids) == len(set(ids.tolist())) == len(expected)
        assert dict(zip(ids.tolist(), counts.tolist())) == {t: float(c) for t, c in expected.items()}
        assert counts.dtype == np.float32


@pytest.mark.parametrize("seed", SEEDS)
def test_penalties_and_bans_match_dense_reference(seed):
    requests, logits = make_requests(seed)
    expected = reference_processed(logits, requests)
    x = logits.copy()
    inputs = penalty_inputs(requests)
    assert inputs is not None
    penalties.apply_penalties(x, inputs)
    penalties.apply_bans(x, banned_pairs(requests))
    np.testing.assert_allclose(x, expected, rtol=1e-6)
    assert np.isinf(expected).any() and not np.array_equal(np.isinf(expected), np.isinf(logits))


def test_all_neutral_rows_need_no_penalty_inputs():
    requests, logits = make_requests(11, all_neutral=True)
    assert penalty_inputs(requests) is None
    x = logits.copy()
    penalties.apply_bans(x, banned_pairs(requests))
    np.testing.assert_allclose(x, reference_processed(logits, requests), rtol=1e-6)


def test_penalty_formula_on_hand_computed_values():
    """One row, worked by hand: prompt [1, 2], output [2, 3, 3], r = 2, frequency 0.5, presence 0.25."""
    logits = np.array([[1.0, 4.0, -4.0, 6.0, 3.0]], np.float32)
    request = SimpleNamespace(
        sampling_params=SimpleNamespace(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
        prompt_token_ids=[1, 2], output_token_ids=[2, 3, 3], prompt_unique=None)
    penalties.apply_penalties(logits, penalty_inputs([request]))
    # token 1 (prompt only): 4 / 2; token 2 (prompt + output once): -4 * 2 - 0.5 - 0.25;
    # token 3 (output twice): 6 / 2 - 1.0 - 0.25; tokens 0 and 4 untouched
    np.testing.assert_allclose(logits[0], [1.0, 2.0, -8.75, 1.75, 3.0], rtol=1e-6)


# ---- the sampler end to end -------------------------------------------------------------------------
def metadata(requests, uniforms, num_logprobs, mode):
    rows = len(requests)
    return SamplingMetadata(
        temperature=np.array([r.sampling_params.temperature for r in requests], np.float64),
        top_k=np.zeros(rows, np.int64), top_p=np.ones(rows), min_p=np.zeros(rows), uniforms=uniforms,
        banned=banned_pairs(requests), penalties=penalty_inputs(requests),
        num_logprobs=num_logprobs, logprobs_mode=mode,
    )


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
@pytest.mark.parametrize("seed", SEEDS)
def test_sample_end_to_end_against_reference(seed, mode):
    requests, logits = make_requests(seed)
    processed = reference_processed(logits, requests).astype(np.float64)
    temperature = np.array([r.sampling_params.temperature for r in requests])
    scaled = processed / np.where(temperature > 0, temperature, 1.0)[:, None]  # greedy rows: T = 1
    rng = np.random.default_rng(100 + seed)
    uniforms = rng.random(ROWS)
    num_logprobs = np.array([[-1, 0, 1, 5][row % 4] for row in range(ROWS)], np.int64)

    out = sample(paddle.to_tensor(logits), metadata(requests, uniforms, num_logprobs, mode))

    for row in range(ROWS):
        token = int(out.token_ids[row])
        assert np.isfinite(processed[row, token]), f"row {row}: banned token {token} chosen"
        if temperature[row] == 0:
            assert token == int(np.argmax(processed[row])), f"row {row}: greedy is not the reference argmax"
        else:  # inverse CDF of softmax(processed / T) in token-id order at the row's uniform
            p = np.exp(log_softmax(scaled[row]))
            assert token == min(int(np.searchsorted(np.cumsum(p), uniforms[row], side="right")), VOCAB - 1)
        lp = out.logprobs[row]
        if num_logprobs[row] < 0:
            assert lp is None
            continue
        reference = log_softmax(scaled[row] if mode == "processed_logprobs" else logits[row])
        np.testing.assert_allclose(lp.token_logprobs, [reference[token]], atol=1e-5, rtol=0)
        k = int(num_logprobs[row])
        top = np.argsort(-reference, kind="stable")[:k]
        assert lp.top_ids.shape == (1, k) and lp.top_ids[0].tolist() == top.tolist()
        np.testing.assert_allclose(lp.top_logprobs[0], reference[top], atol=1e-5, rtol=0)

