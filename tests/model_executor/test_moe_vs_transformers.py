"""Our sparse MoE models (Qwen3-MoE, ERNIE-4.5-MoE) against transformers on tiny random checkpoints.

Oracle: transformers 5 (torch CPU, float32), the same weights saved by transformers and loaded by
our LLM. For each case:
- logits at every position of a ragged batch of prompts (one prefill step) match transformers'
  (each prompt alone) within 1e-4, and 32 greedy tokens through LLM.generate equal transformers'
  generate(do_sample=False);
- the routing (chosen experts per token, their weights) of every MoE layer equals transformers'
  (captured by hooks on the routers), and for ERNIE the e_score_correction_bias changes choices
  compared with routing by p alone (the bias chooses; the weights stay p);
- layer kinds: dense layers carry no expert tensors and a checkpoint that gives them some, or lacks
  one expert's tensor, fails to load with an error naming the tensor.
Tiny models: hidden 64, 3 layers, 4 heads / 2 KV heads, 6 experts, top-2, vocab 512,
initializer_range 0.2 so greedy continuations vary.
"""
import re
import shutil

import numpy as np
import pytest
import torch

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.layers.mlp import DenseMLP
from fastdeploy.model_executor.layers.moe import SparseMoE

from runner_access import model_runner
from test_llama_vs_transformers import our_prefill_logits
from tiny_llama import write_tokenizer

VOCAB_SIZE = 512
NUM_EXPERTS, TOP_K = 6, 2
PROMPT_LENGTHS = [1, 7, 64, 65, 130]  # around block boundaries of block_size 64
GREEDY_PROMPTS = [1, 2, 3]  # indices into the prompts: lengths 7, 64, 65
GREEDY_TOKENS = 32

COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=2)

# name -> (family, config overrides, sparse layer indices as transformers builds them)
CASES = {
    "qwen3_moe_norm": ("qwen3_moe", dict(norm_topk_prob=True, mlp_only_layers=[0]), [1, 2]),
    "qwen3_moe_no_norm": ("qwen3_moe", dict(norm_topk_prob=False, mlp_only_layers=[0]), [1, 2]),
    "qwen3_moe_sparse_step2": ("qwen3_moe", dict(norm_topk_prob=True, mlp_only_layers=[], decoder_sparse_step=2), [1]),
    "ernie_moe": ("ernie4_5_moe", dict(use_bias=False, tie_word_embeddings=False), [1, 2]),
    "ernie_moe_use_bias": ("ernie4_5_moe", dict(use_bias=True, tie_word_embeddings=True), [1, 2]),
}


def make_tiny_moe(path, family: str, seed: int = 0, **overrides):
    """Save a random 3-layer MoE model of `family` at `path`; returns the transformers model (float32)."""
    torch.manual_seed(seed)
    if family == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        config = Qwen3MoeConfig(**COMMON, head_dim=32, num_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K,
                                rms_norm_eps=1e-6, tie_word_embeddings=False, **overrides)
        model = Qwen3MoeForCausalLM(config).eval()
    else:
        from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM

        config = Ernie4_5_MoeConfig(**COMMON, moe_num_experts=NUM_EXPERTS, moe_k=TOP_K, moe_layer_start_index=1,
                                    moe_num_shared_experts=1, rms_norm_eps=1e-5, **overrides)
        model = Ernie4_5_MoeForCausalLM(config).eval()
        with torch.no_grad():
            for layer in model.model.layers:
                if hasattr(layer.mlp, "gate"):  # a non-zero correction bias large enough to change choices
                    layer.mlp.gate.moe_statics.e_score_correction_bias.normal_(0, 0.1)
                if config.use_bias:  # random (not zero-initialised) biases so they matter
                    for name, param in layer.named_parameters():
                        if name.endswith(".bias"):
                            param.normal_(0, 0.2)
            if config.use_bias:
                model.lm_head.bias.normal_(0, 0.2)
    model.save_pretrained(str(path))
    write_tokenizer(path)
    return model


def make_prompts(seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB_SIZE, size=n).tolist() for n in PROMPT_LENGTHS]


class Case:
    def __init__(self, name, path):
        self.name = name
        self.family, overrides, self.sparse_layers = CASES[name]
        self.path = path
        self.hf = make_tiny_moe(path, self.family, **overrides)
        self.llm = LLM(model=str(path), max_model_len=512, num_gpu_blocks_override=64)
        self.prompts = make_prompts()


_built: dict[str, Case] = {}


def _case(name, tmp_path_factory) -> Case:
    if name not in _built:
        _built[name] = Case(name, tmp_path_factory.mktemp(name))
    return _built[name]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory) -> Case:
    return _case(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=[name for name, spec in CASES.items() if spec[0] == "ernie4_5_moe"])
def ernie_case(request, tmp_path_factory) -> Case:
    return _case(request.param, tmp_path_factory)


def hf_routing(hf, prompts, sparse_layers):
    """{layer: (router_logits [n, E], weights [n, k], experts [n, k])} over the prompts, each run alone."""
    captured = {i: [] for i in sparse_layers}
    hooks = [hf.model.layers[i].mlp.gate.register_forward_hook(
        lambda module, args, out, i=i: captured[i].append(tuple(t.detach().float().numpy() for t in out)))
        for i in sparse_layers]
    try:
        for prompt in prompts:
            with torch.no_grad():
                hf(torch.tensor([prompt]))
    finally:
        for h in hooks:
            h.remove()
    return {i: tuple(np.concatenate([step[j] for step in steps]) for j in range(3)) for i, steps in captured.items()}


def our_routing(llm, prompts, monkeypatch):
    """{layer: Routing} of our one ragged prefill of the prompts (SparseMoE.route wrapped), layer by
    layer through SparseMoE's numpy routing (the compiled fd_moe_mlp and the fused op route in C++ and
    are checked against it in test_moe_op.py; their logits against transformers' above)."""
    model = model_runner(llm).model
    layer_of = {id(layer.mlp): i for i, layer in enumerate(model.model.layers)}
    monkeypatch.setattr(model.model, "runs", list(model.model.layers))
    for layer in model.model.layers:
        if isinstance(layer.mlp, SparseMoE):
            monkeypatch.setattr(layer.mlp, "_op", None)
    captured = {}
    route = SparseMoE.route

    def recording_route(self, x):
        routing = route(self, x)
        captured.setdefault(layer_of[id(self)], []).append(routing)
        return routing

    monkeypatch.setattr(SparseMoE, "route", recording_route)
    logits = our_prefill_logits(llm, prompts)
    monkeypatch.undo()
    assert all(len(calls) == 1 for calls in captured.values())  # one prefill step, one call per MoE layer
    return {i: calls[0] for i, calls in captured.items()}, logits


def sorted_by_expert(experts, weights):
    order = np.argsort(experts, axis=1, kind="stable")
    return np.take_along_axis(experts, order, axis=1), np.take_along_axis(weights, order, axis=1)


# ---- 1. logits and greedy tokens ---------------------------------------------------------------
def test_prefill_logits_match_transformers(case):
    ours = our_prefill_logits(case.llm, case.prompts)
    for prompt, logits in zip(case.prompts, ours):
        with torch.no_grad():
            ref = case.hf(torch.tensor([prompt])).logits[0].numpy()
        assert logits.shape == ref.shape
        diff = float(np.abs(logits - ref).max())
        assert diff <= 1e-4, f"{case.name}: prompt of {len(prompt)} tokens, max abs diff {diff}"


def test_greedy_tokens_match_transformers(case):
    prompts = [case.prompts[i] for i in GREEDY_PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    outputs = case.llm.generate(prompts, params, use_tqdm=False)
    for prompt, output in zip(prompts, outputs):
        with torch.no_grad():
            ref = case.hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=GREEDY_TOKENS,
                                   min_new_tokens=GREEDY_TOKENS)
        assert output.outputs.token_ids == ref[0, len(prompt):].tolist(), f"{case.name}: prompt of {len(prompt)}"
    assert len(set(t for o in outputs for t in o.outputs.token_ids)) > 4  # continuations vary


# ---- 2. routing decisions ----------------------------------------------------------------------
def test_routing_matches_transformers(case, monkeypatch):
    ref = hf_routing(case.hf, case.prompts, case.sparse_layers)
    ours, _ = our_routing(case.llm, case.prompts, monkeypatch)
    assert sorted(ours) == case.sparse_layers  # the same layers are MoE, the others dense
    n = sum(PROMPT_LENGTHS)
    for i in case.sparse_layers:
        _, ref_weights, ref_experts = ref[i]
        routing = ours[i]
        assert routing.experts.shape == ref_experts.shape == (n, TOP_K)
        our_e, our_w = sorted_by_expert(routing.experts, routing.weights)
        ref_e, ref_w = sorted_by_expert(ref_experts, ref_weights)
        mismatch = np.nonzero((our_e != ref_e).any(axis=1))[0]
        assert mismatch.size == 0, (f"{case.name} layer {i}: {mismatch.size} tokens routed differently, e.g. "
                                    f"token {mismatch[0]}: ours {our_e[mismatch[0]]} vs {ref_e[mismatch[0]]}")
        assert np.abs(our_w - ref_w).max() <= 1e-5, f"{case.name} layer {i}"
        sums = routing.weights.sum(axis=1)
        if case.family == "ernie4_5_moe" or CASES[case.name][1].get("norm_topk_prob"):
            np.testing.assert_allclose(sums, 1.0, atol=1e-5)
        else:
            assert (sums < 1 - 1e-3).all()  # unnormalised top-2 of 6 probabilities


def test_ernie_correction_bias_chooses_but_does_not_weight(ernie_case, monkeypatch):
    case = ernie_case
    ref = hf_routing(case.hf, case.prompts, case.sparse_layers)
    ours, _ = our_routing(case.llm, case.prompts, monkeypatch)
    model = model_runner(case.llm).model
    changed = 0
    for i in case.sparse_layers:
        bias = case.hf.model.layers[i].mlp.gate.moe_statics.e_score_correction_bias.detach().numpy()[0]
        statics = model.model.layers[i].mlp.moe_statics
        np.testing.assert_array_equal(statics.e_score_correction_bias.numpy()[0], bias)
        router_logits, ref_weights, ref_experts = ref[i]
        p = torch.softmax(torch.from_numpy(router_logits), dim=-1).numpy()
        by_p = np.sort(np.argsort(-p, axis=1, kind="stable")[:, :TOP_K], axis=1)
        chosen = np.sort(ours[i].experts, axis=1)
        changed += int((by_p != chosen).any(axis=1).sum())
        # weights are the chosen experts' p renormalised (not p + bias)
        picked = np.take_along_axis(p, ours[i].experts, axis=1)
        np.testing.assert_allclose(ours[i].weights, picked / picked.sum(axis=1, keepdims=True), atol=1e-5)
    assert changed > 0, "the correction bias changed no choice: the test would not see it ignored"


# ---- 3. layer kinds and checkpoint checks ------------------------------------------------------
def _rewrite_checkpoint(src, dst, edit):
    """Copy the checkpoint dir src to dst with its tensors {name: array} passed through edit."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    save_file(edit(tensors), str(dst / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def ernie_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("ernie_kinds")
    make_tiny_moe(path, "ernie4_5_moe", seed=1, use_bias=False, tie_word_embeddings=False)
    return path


@pytest.fixture(scope="module")
def qwen3_moe_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_moe_kinds")
    make_tiny_moe(path, "qwen3_moe", seed=1, norm_topk_prob=True, mlp_only_layers=[0])
    return path


def test_ernie_dense_first_layer_has_no_experts(ernie_dir, tmp_path):
    from safetensors import safe_open

    with safe_open(str(ernie_dir / "model.safetensors"), "np") as f:
        names = list(f.keys())
    assert not any(n.startswith("model.layers.0.mlp.experts.") for n in names)
    assert "model.layers.0.mlp.gate_proj.weight" in names
    llm = LLM(model=str(ernie_dir), max_model_len=256, num_gpu_blocks_override=8)
    model = model_runner(llm).model
    assert isinstance(model.model.layers[0].mlp, DenseMLP)
    assert [isinstance(layer.mlp, SparseMoE) for layer in model.model.layers] == [False, True, True]
    expected = model.expected_weight_names()
    assert not any(n.startswith("model.layers.0.mlp.experts.") or n.startswith("model.layers.0.mlp.gate.")
                   for n in expected)
    assert "model.layers.1.mlp.shared_experts.gate_proj.weight" in expected
    assert "model.layers.1.mlp.moe_statics.e_score_correction_bias" in expected

    # a checkpoint giving the dense layer 0 an expert is refused, naming the tensor
    bad = "model.layers.0.mlp.experts.0.gate_proj.weight"

    def add_expert(tensors):
        tensors[bad] = tensors["model.layers.1.mlp.experts.0.gate_proj.weight"].copy()
        return tensors

    _rewrite_checkpoint(ernie_dir, tmp_path / "extra", add_expert)
    with pytest.raises(ValueError, match=re.escape(bad)):
        LLM(model=str(tmp_path / "extra"), max_model_len=256, num_gpu_blocks_override=8)


def test_missing_expert_tensor_is_named(qwen3_moe_dir, tmp_path):
    missing = "model.layers.1.mlp.experts.3.up_proj.weight"

    def drop(tensors):
        del tensors[missing]
        return tensors

    _rewrite_checkpoint(qwen3_moe_dir, tmp_path / "missing", drop)
    with pytest.raises(ValueError, match=re.escape(missing)):
        LLM(model=str(tmp_path / "missing"), max_model_len=256, num_gpu_blocks_override=8)
    # the intact checkpoint loads (so the failure above is the missing tensor's)
    LLM(model=str(qwen3_moe_dir), max_model_len=256, num_gpu_blocks_override=8)
