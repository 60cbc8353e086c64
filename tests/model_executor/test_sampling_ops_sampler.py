"""The sampler (layers/sample/sampler.py) end to end with the compiled sampling, penalties and logprobs
ops against the same sampler with the numpy fallbacks forced.
"""
import fastdeploy  # noqa: F401  (before paddle)
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.sample.penalties import apply_penalties
from fastdeploy.model_executor.layers.sample.sampler import SamplingMetadata, sample
from fastdeploy.model_executor.ops import fallbacks_forced

from sampling_reference import compiled  # noqa: F401  (autouse fixture: every test here runs the compiled ops)
from sampling_reference import FILTERS, draw_order, holds, make_logits, random_penalties, settled_filters, weights64


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_sample_with_compiled_ops_equals_sample_with_fallbacks(mode):
    """Penalties, bans, greedy and filtered rows, logprobs: the same tokens either way (but where u sits
    on a CDF boundary: then both tokens hold u), the same logprobs."""
    rng = np.random.default_rng(11)
    rows, vocab = 16, 49152
    logits = make_logits("peaked", rows, vocab, rng)
    filters = [FILTERS[r % len(FILTERS)] for r in range(rows)]
    temperature = np.array([0.0 if r % 5 == 0 else f[0] for r, f in enumerate(filters)])
    uniforms = rng.random(rows)
    penalties = random_penalties(rng, rows, vocab)
    banned = [(r, [int(t) for t in rng.choice(vocab, 3)]) for r in range(0, rows, 3)]
    processed = logits.copy()
    apply_penalties(processed, penalties)
    for r, ids in banned:
        processed[r, ids] = -np.inf
    top_k, top_p, min_p = np.zeros(rows), np.ones(rows), np.zeros(rows)
    references = {}
    for r in np.flatnonzero(temperature > 0):
        w = weights64(processed[r], temperature[r])
        top_k[r], top_p[r], min_p[r] = settled_filters(w, *filters[r][1:])
        references[r] = draw_order(w, int(top_k[r]), top_p[r], min_p[r])
    md = SamplingMetadata(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, uniforms=uniforms,
                          banned=banned, penalties=penalties, num_logprobs=np.array([(-1, 0, 3, 8)[r % 4] for r in range(rows)]),
                          logprobs_mode=mode)

    out = sample(paddle.to_tensor(logits), md)
    with fallbacks_forced():
        reference = sample(paddle.to_tensor(logits), md)

    greedy = temperature == 0
    np.testing.assert_array_equal(out.token_ids[greedy], processed[greedy].argmax(axis=1))
    np.testing.assert_array_equal(out.token_ids[greedy], reference.token_ids[greedy])
    for r, (ids, cdf) in references.items():
        assert holds(ids, cdf, int(out.token_ids[r]), uniforms[r]) and holds(ids, cdf, int(reference.token_ids[r]), uniforms[r])
    assert (out.token_ids != reference.token_ids).sum() <= 1
    for r, (got, want) in enumerate(zip(out.logprobs, reference.logprobs)):
        assert (got is None) == (want is None)
        if got is not None:
            assert got.top_ids.shape == want.top_ids.shape == (1, md.num_logprobs[r])
            np.testing.assert_array_equal(got.top_ids, want.top_ids)
            np.testing.assert_allclose(got.top_logprobs, want.top_logprobs, rtol=0, atol=1e-5)
            if out.token_ids[r] == reference.token_ids[r]:
                np.testing.assert_allclose(got.token_logprobs, want.token_logprobs, rtol=0, atol=1e-5)
                np.testing.assert_array_equal(got.token_ranks, want.token_ranks)
