"""GGUF files of every zoo architecture, in every weight type, against transformers.

Oracle: transformers (torch CPU, float32) on the checkpoint each file means: its tensors as gguf-py's
`dequantize` gives them, Llama's Q/K rows permuted back (gguf_checkpoints.py writes both). For each
(architecture, type): greedy tokens of 32 prompts through LLM.generate equal transformers' (>= 30/32
identical, a divergence allowed only after a near-tie of transformers' top-2 logits), and the logits
of one ragged prefill are within 1e-3 of transformers' relative to their largest magnitude.
Every architecture is run in one type (a rotation through the block and K types); every type on
ERNIE-4.5-MoE (a dense leading layer, a shared expert, the correction bias, experts in stacks) and on
Llama (permuted Q/K rows). The MoE files also run through the fused decoder op, bit for bit
as layer by layer. Then what the loader reads: the config against transformers' config, expert
tensors as views of the file, and its errors.
"""
import json

import gguf
import numpy as np
import pytest
import torch

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.layers.moe import SparseMoE
from fastdeploy.model_executor.layers.quantization.gguf import SegmentedGGUFLinearMethod
from fastdeploy.model_executor.model_loader.gguf_file import GGUFFile
from fastdeploy.model_executor.model_loader.gguf_loader import iter_gguf_tensors, open_gguf
from fastdeploy.model_executor.model_loader.quantized import QuantizedTensor

from gguf_checkpoints import ARCHS, BLOCK_TYPES, FLOAT_TYPES, K_TYPES, Q, Q4_K_M_LIKE, write_gguf
from helpers import NEAR_TIE
from runner_access import model_runner
from test_fused_decoder_layers import fused_and_layerwise
from test_llama_vs_transformers import our_prefill_logits
from tiny_llama import VOCAB_SIZE

ALL_TYPES = (*FLOAT_TYPES, *BLOCK_TYPES, *K_TYPES)
ARCH_TYPES = {"llama": Q.Q4_0, "qwen2": Q.Q4_1, "qwen3": Q.Q8_0, "qwen3moe": Q.Q4_K, "ernie4_5": Q.Q5_K,
              "ernie4_5-moe": Q.Q6_K}
# every type on ERNIE-4.5-MoE (MoE) and on Llama (permuted Q/K rows)
TYPE_SWEEPS = {"ernie4_5-moe": ALL_TYPES, "llama": ALL_TYPES}
CASES = sorted({*ARCH_TYPES.items(), *((a, t) for a, types in TYPE_SWEEPS.items() for t in types)},
               key=lambda case: (case[0], ALL_TYPES.index(case[1])))
CASES += [("llama", Q4_K_M_LIKE), ("ernie4_5-moe", Q4_K_M_LIKE)]  # packed projections of several types
NUM_PROMPTS, NEW_TOKENS = 32, 8
LOGIT_TOLERANCE = 1e-3  # of the largest reference logit's magnitude

_built = {}


class Case:
    def __init__(self, arch, qtype, path):
        from transformers import AutoModelForCausalLM

        self.arch, self.qtype = arch, qtype
        self.file, oracle_dir = write_gguf(path, arch, qtype)
        self.hf = AutoModelForCausalLM.from_pretrained(str(oracle_dir), dtype=torch.float32).eval()
        self.hf_config = json.loads((oracle_dir / "config.json").read_text())
        self.llm = LLM(model=str(self.file), max_model_len=256, num_gpu_blocks_override=64)


def _case(arch, qtype, tmp_path_factory) -> Case:
    if (arch, qtype) not in _built:
        _built[(arch, qtype)] = Case(arch, qtype, tmp_path_factory.mktemp(f"{arch}-{qtype.name}"))
    return _built[(arch, qtype)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{t.name}" for a, t in CASES])
def case(request, tmp_path_factory) -> Case:
    return _case(*request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(3, VOCAB_SIZE, size=n).tolist() for n in rng.integers(1, 40, size=NUM_PROMPTS)]


def hf_greedy(hf, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
    """transformers' greedy tokens of each prompt (EOS not stopping; one left-padded batch) and the
    top-2 logit gap at each."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None,
                          pad_token_id=2, output_scores=True, return_dict_in_generate=True)
    top2 = torch.stack([torch.topk(s, 2, dim=-1).values for s in out.scores], dim=1)  # [prompts, steps, 2]
    return out.sequences[:, width:].tolist(), (top2[..., 0] - top2[..., 1]).tolist()


def test_greedy_tokens_match_transformers(case, prompts):
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outputs = case.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    same, failures = 0, []
    for prompt, output, ref, gaps in zip(prompts, outputs, *hf_greedy(case.hf, prompts)):
        ours = output.outputs.token_ids
        first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
        same += first is None
        if first is not None and gaps[first] >= NEAR_TIE:
            failures.append(f"prompt of {len(prompt)}: token {first} {ours[first]} vs {ref[first]} (gap {gaps[first]:.2e})")
    assert not failures, f"{case.arch} {case.qtype.name}: {failures}"
    assert same >= NUM_PROMPTS - 2, f"{case.arch} {case.qtype.name}: {same}/{NUM_PROMPTS} identical"
    assert len({t for o in outputs for t in o.outputs.token_ids}) > 8  # continuations vary


def test_prefill_logits_match_transformers(case, prompts):
    batch = prompts[:6]
    for prompt, logits in zip(batch, our_prefill_logits(case.llm, batch)):
        with torch.no_grad():
            ref = case.hf(torch.tensor([prompt])).logits[0].numpy()
        error = float(np.abs(logits - ref).max() / np.abs(ref).max())
        assert error <= LOGIT_TOLERANCE, f"{case.arch} {case.qtype.name}: prompt of {len(prompt)}, relative error {error:.2e}"


# ---- the MoE files through the fused decoder op ------------------------------------------------
FUSED_CASES = [("qwen3moe", Q.Q8_0), ("qwen3moe", Q.Q4_K), ("ernie4_5-moe", Q.Q4_0), ("ernie4_5-moe", Q.Q6_K),
               ("ernie4_5-moe", Q4_K_M_LIKE)]


@pytest.mark.usefixtures("ops_enabled")
@pytest.mark.parametrize("arch,qtype", FUSED_CASES, ids=[f"{a}-{t.name}" for a, t in FUSED_CASES])
def test_moe_gguf_fused_equals_layerwise(arch, qtype, tmp_path_factory):
    llm = LLM(model=str(_case(arch, qtype, tmp_path_factory).file), max_model_len=256, num_gpu_blocks_override=32)
    decoder = model_runner(llm).model.model
    moe = [layer.mlp for layer in decoder.layers if isinstance(layer.mlp, SparseMoE)]
    assert len(moe) == 2
    if qtype is Q4_K_M_LIKE:  # q/k/v and the experts' gate/up each in segments of their types
        assert all(isinstance(linear.method, SegmentedGGUFLinearMethod) for layer in decoder.layers
                   for linear in (layer.self_attn.qkv_proj, *(e.gate_up_proj for e in moe[0].experts)))
    if qtype in BLOCK_TYPES:  # the experts stay in their blocks inside the fused op
        assert all(linear.method.operand(linear, 1)[1] == int(qtype)
                   for m in moe for e in m.experts for linear in (e.gate_up_proj, e.down_proj))
    rng = np.random.default_rng(5)
    for lengths, history in (([1, 1, 1], 20), ([7, 30], 0)):
        batch = [rng.integers(3, VOCAB_SIZE, size=n).tolist() for n in lengths]
        fused, layerwise = fused_and_layerwise(llm, batch, history)
        assert np.isfinite(fused).all()
        np.testing.assert_array_equal(fused, layerwise, err_msg=f"{arch} {qtype.name} {lengths} {history}")


# ---- what the loader reads ----------------------------------------------------------------------
CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "head_dim", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "vocab_size", "use_bias",
               "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "moe_num_experts",
               "moe_k", "moe_layer_start_index", "moe_layer_interval", "moe_num_shared_experts")


@pytest.mark.parametrize("arch", list(ARCHS))
def test_config_matches_transformers(arch, tmp_path_factory):
    case = _case(arch, ARCH_TYPES[arch], tmp_path_factory)
    ours, theirs = open_gguf(case.file).hf_config, case.hf_config
    for key in CONFIG_KEYS:
        if key in theirs:
            assert ours[key] == pytest.approx(theirs[key]), key
    assert ours["rope_theta"] == theirs["rope_parameters"]["rope_theta"]
    assert ours["architectures"] == theirs["architectures"]


def test_experts_are_views_of_the_file(tmp_path_factory):
    case = _case("ernie4_5-moe", Q.Q4_0, tmp_path_factory)
    source = open_gguf(case.file)
    experts = [(name, t) for name, t in iter_gguf_tensors(source.gguf_file, source.hf_config) if ".experts." in name]
    assert len(experts) == 2 * 3 * ARCHS["ernie4_5-moe"][2]["moe_num_experts"]
    stack = next(t for t in source.gguf_file.tensors if t.name == "blk.1.ffn_down_exps.weight")
    first = dict(experts)["model.layers.1.mlp.experts.0.down_proj.weight"]
    assert isinstance(first, QuantizedTensor) and first.shape == (256, 256)
    for _, tensor in experts:
        assert isinstance(tensor, QuantizedTensor) and np.shares_memory(tensor.blocks, source.gguf_file._map)
    np.testing.assert_array_equal(first.blocks, stack.data[0])


def _rewrite(src, dst, arch=None, drop=(), **values):
    """A copy of GGUF file `src` at `dst` with metadata `values` set (and `general.architecture` = arch),
    and the keys in `drop` left out."""
    reader = gguf.GGUFReader(str(src))
    old_arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch or old_arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop or key in values:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    for key, (value, kind) in values.items():
        writer.add_key_value(key, value, kind)
    for tensor in reader.tensors:
        plain = tensor.tensor_type in (Q.F32, Q.F16)
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=None if plain else tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_unknown_architecture_is_refused(tmp_path, tmp_path_factory):
    case = _case("qwen3", ARCH_TYPES["qwen3"], tmp_path_factory)
    bad = _rewrite(case.file, tmp_path / "x.gguf", arch="gemma3")
    with pytest.raises(ValueError, match=r"GGUF architecture 'gemma3' .* not supported; supported: .*'qwen3moe'"):
        open_gguf(bad)


def test_moe_layers_disagreeing_with_the_metadata_are_refused(tmp_path, tmp_path_factory):
    case = _case("ernie4_5-moe", ARCH_TYPES["ernie4_5-moe"], tmp_path_factory)
    U32 = gguf.GGUFValueType.UINT32
    bad = _rewrite(case.file, tmp_path / "x.gguf", **{"ernie4_5-moe.leading_dense_block_count": (0, U32)})
    with pytest.raises(ValueError, match=r"layers with a router \[1, 2\] .*leading_dense_block_count=0"):
        open_gguf(bad)
    bad = _rewrite(case.file, tmp_path / "y.gguf", **{"ernie4_5-moe.expert_shared_count": (2, U32)})
    with pytest.raises(ValueError, match=r"ffn_up_shexp.weight has 256 rows; .*expert_shared_count=2"):
        open_gguf(bad)
    bad = _rewrite(case.file, tmp_path / "z.gguf", drop=("ernie4_5-moe.expert_count",))
    with pytest.raises(ValueError, match=r"lacks ernie4_5-moe.expert_count"):
        open_gguf(bad)


def test_file_header_types_are_what_was_written(tmp_path_factory):
    """The cases' files really hold their type (the writer, not the loader, under test here)."""
    for arch, qtype in (("llama", Q.Q3_K), ("ernie4_5-moe", Q.BF16)):
        file = GGUFFile(_case(arch, qtype, tmp_path_factory).file)
        matrices = [t for t in file.tensors if len(t.shape) >= 2 and "ffn_gate_inp" not in t.name
                    and "exp_probs_b" not in t.name]
        assert matrices and all(t.tensor_type == qtype for t in matrices)


def test_shared_expert_count_missing_from_the_metadata_is_read_off_the_tensors(tmp_path, tmp_path_factory):
    """Not every converter writes expert_shared_count; the shared experts' rows then give it."""
    case = _case("ernie4_5-moe", ARCH_TYPES["ernie4_5-moe"], tmp_path_factory)
    file = _rewrite(case.file, tmp_path / "x.gguf", drop=("ernie4_5-moe.expert_shared_count",))
    assert open_gguf(file).hf_config["moe_num_shared_experts"] == case.hf_config["moe_num_shared_experts"] > 0
