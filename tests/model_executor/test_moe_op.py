"""The compiled sparse-MoE MLP `fd_moe_mlp` (custom_ops/cpu_ops/moe.cc; SparseMoE.forward and the MoE layers
of fd_decoder_layers run it) against a float64 numpy reference of the routing and the experts written
here from the formulas in layers/moe.py's docstring, and its routing against SparseMoE's numpy
`select_experts` (which test_moe_vs_transformers.py checks against transformers).

Cases: top-k renormalised or not, ERNIE's norm_min floor, a correction bias that changes choices but
not weights, tied router probabilities (the lower expert id wins, as torch.topk), experts no token
chose, shared experts with biases, a batch of one token, and input errors.
"""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.moe import select_experts
from fastdeploy.model_executor.ops import compiled_op

pytestmark = pytest.mark.usefixtures("ops_enabled")

HIDDEN, INTER, SHARED_INTER, EXPERTS = 32, 16, 24, 6


def silu(x):
    return x / (1 + np.exp(-x))


def mlp64(x, gate_up, down, inter, gate_up_bias=None, down_bias=None):
    """float64 SwiGLU MLP; gate_up [hidden, 2 inter] (gate | up), down [inter, hidden]."""
    h = x @ gate_up + (0 if gate_up_bias is None else gate_up_bias)
    return (silu(h[:, :inter]) * h[:, inter:]) @ down + (0 if down_bias is None else down_bias)


def reference(x, router, bias, experts, shared, top_k, normalize, norm_min):
    """float64: p = softmax(x @ router); top_k by p + bias (ties: lower id); weights p (renormalised)."""
    logits = x.astype(np.float64) @ router
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    scores = p + (0 if bias is None else bias)
    out = np.zeros(x.shape)
    for t in range(len(x)):
        chosen = sorted(range(EXPERTS), key=lambda e: (-scores[t, e], e))[:top_k]
        w = p[t, chosen]
        if normalize:
            w = w / max(w.sum(), norm_min)
        for e, we in zip(chosen, w):
            out[t] += we * mlp64(x[t : t + 1].astype(np.float64), *experts[e], INTER)[0]
    if shared is not None:
        out += mlp64(x.astype(np.float64), shared[0], shared[1], SHARED_INTER, shared[2], shared[3])
    return out


def run_op(x, router, bias, experts, shared, top_k, normalize, norm_min):
    t = lambda a: paddle.to_tensor(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
    absent = paddle.zeros([0], "float32")
    shared_args = [t(a) for a in shared] if shared is not None else [absent] * 4
    return compiled_op("fd_moe_mlp")(
        t(x), t(router), absent if bias is None else t(bias), [t(g) for g, _ in experts], [t(d) for _, d in experts],
        *shared_args, [0] * (2 * EXPERTS), [0, 0], top_k, INTER, SHARED_INTER if shared is not None else 0,
        normalize, norm_min).numpy()


def make(seed, tokens=9):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, HIDDEN)).astype(np.float32)
    router = (0.5 * rng.standard_normal((HIDDEN, EXPERTS))).astype(np.float32)
    experts = [((0.2 * rng.standard_normal((HIDDEN, 2 * INTER))).astype(np.float32),
                (0.2 * rng.standard_normal((INTER, HIDDEN))).astype(np.float32)) for _ in range(EXPERTS)]
    shared = ((0.2 * rng.standard_normal((HIDDEN, 2 * SHARED_INTER))).astype(np.float32),
              (0.2 * rng.standard_normal((SHARED_INTER, HIDDEN))).astype(np.float32),
              (0.1 * rng.standard_normal(2 * SHARED_INTER)).astype(np.float32),
              (0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    bias = (0.3 * rng.standard_normal(EXPERTS)).astype(np.float32)
    return x, router, bias, experts, shared


@pytest.mark.parametrize("top_k, normalize, norm_min", [(2, True, 1e-12), (2, False, 0.0), (3, True, 0.99), (6, True, 0.0)])
@pytest.mark.parametrize("with_bias, with_shared", [(False, False), (True, True)])
def test_moe_mlp_equals_the_float64_reference(top_k, normalize, norm_min, with_bias, with_shared):
    x, router, bias, experts, shared = make(seed=top_k)
    bias, shared = (bias if with_bias else None), (shared if with_shared else None)
    got = run_op(x, router, bias, experts, shared, top_k, normalize, norm_min)
    want = reference(x, router, bias, experts, shared, top_k, normalize, norm_min)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    if norm_min == 0.99:  # the floor binds: top-3 of 6 probabilities sum below 0.99 for some token
        assert (np.sort(np.exp(x @ router) / np.exp(x @ router).sum(1, keepdims=True), 1)[:, -3:].sum(1) < 0.99).any()


def test_the_correction_bias_chooses_but_does_not_weight_and_its_choices_match_select_experts():
    x, router, bias, experts, _ = make(seed=5, tokens=40)
    logits = x @ router
    chosen_by_p = select_experts(logits, 2, True).experts
    routing = select_experts(logits, 2, True, correction_bias=bias)
    assert (np.sort(chosen_by_p, 1) != np.sort(routing.experts, 1)).any(), "the bias must change some choice"
    got = run_op(x, router, bias, experts, None, 2, True, 1e-12)
    expected = np.zeros_like(got, dtype=np.float64)  # select_experts' routing, experts in float64
    for t in range(len(x)):
        for e, w in zip(routing.experts[t], routing.weights[t]):
            expected[t] += w * mlp64(x[t : t + 1].astype(np.float64), *experts[e], INTER)[0]
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


def test_tied_probabilities_choose_the_lower_expert_id():
    x, router, _, experts, _ = make(seed=7, tokens=5)
    router[:, 4] = router[:, 1]  # experts 1 and 4 always tie
    router[:, 1] += 3.0 * np.sign(x.sum(0)) / HIDDEN  # ... and lead often enough to be chosen
    router[:, 4] = router[:, 1]
    top1 = np.argmax(x @ router, axis=1)
    assert (top1 == 1).any() or (top1 == 4).any()
    got = run_op(x, router, None, experts, None, 1, True, 0.0)
    want = reference(x, router, None, experts, None, 1, True, 0.0)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    for t in np.nonzero((top1 == 1) | (top1 == 4))[0]:  # expert 1, not 4, for the tied tokens
        np.testing.assert_allclose(got[t], mlp64(x[t : t + 1].astype(np.float64), *experts[1], INTER)[0],
                                   rtol=2e-5, atol=2e-5)


def test_one_token_and_zero_tokens():
    x, router, bias, experts, shared = make(seed=3, tokens=1)
    got = run_op(x, router, bias, experts, shared, 2, True, 1e-12)
    np.testing.assert_allclose(got, reference(x, router, bias, experts, shared, 2, True, 1e-12), rtol=2e-5, atol=2e-5)
    assert run_op(x[:0], router, bias, experts, shared, 2, True, 1e-12).shape == (0, HIDDEN)


def test_bad_inputs_are_named():
    x, router, bias, experts, _ = make(seed=1)
    with pytest.raises(Exception, match="top_k"):
        run_op(x, router, None, experts, None, EXPERTS + 1, True, 0.0)
    with pytest.raises(Exception, match="router must be float32"):
        run_op(x, router[:, :4], None, experts, None, 2, True, 0.0)
    with pytest.raises(Exception, match="correction_bias"):
        run_op(x, router, bias[:3], experts, None, 2, True, 0.0)
