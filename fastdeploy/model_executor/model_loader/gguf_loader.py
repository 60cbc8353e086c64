"""Open a llama.cpp GGUF file: config and tokenizer from its metadata, tensors by Hugging Face names.

Architectures (`general.architecture`, llama.cpp's names) and the zoo model each becomes:
`ARCHITECTURES`. The HF config is built from the `{arch}.*` keys as llama.cpp's converter writes
them (convert_hf_to_gguf.py) and from which tensors the file holds: tied embeddings when it has no
`output.weight`, Qwen3's attention biases and ERNIE's `use_bias` when it has `attn_q.bias`, the
MoE layers of Qwen3-MoE where it has a router (`ffn_gate_inp`), ERNIE's correction bias where it has
`exp_probs_b`.

Tensors: `blk.N.<part>.weight|bias` -> `model.layers.N.<HF module>.weight|bias` (`_LAYER_NAMES`).
Stacked experts `blk.N.ffn_{gate,up,down}_exps.weight` ([E, rows, row data] in the file) are handed
over one expert at a time as `model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight`, each a view
of the file's expert slice (`hf_tensors`), so they are not copied before the model reads them.
Matrices in a block type the compiled op computes on (quantized.py LINEAR_QTYPES: Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q2_K..Q6_K) come as `QuantizedTensor` (their blocks; the model keeps them quantized,
see layers/quantization/gguf.py, deciding so at build from the header's tensor types:
`gguf_quant_config`); F32 / F16 / BF16 tensors are read as float32 with the `gguf` package; any
other type is a ValueError naming the tensor.
llama.cpp's converter permutes the rows of Llama's Q and K projections (to turn the rotate-half
RoPE layout into the interleaved one it computes with); `unpermute_qk` undoes it, as
transformers' GGUF loader does. It permutes no other architecture's (Qwen computes rotate-half,
ERNIE interleaved, each as its HF checkpoint).
"""
import re
from pathlib import Path
from typing import Iterator

import numpy as np

from fastdeploy.model_executor.model_loader.gguf_file import GGUFFile, GGUFTensor
from fastdeploy.model_executor.model_loader.quantized import FLOAT_QTYPES, LINEAR_QTYPES, QuantizedTensor
from fastdeploy.model_executor.model_loader.source import ModelSource

# llama.cpp architecture -> the zoo model (HF architecture) it loads as
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "ernie4_5": "Ernie4_5ForCausalLM",
    "ernie4_5-moe": "Ernie4_5_MoeForCausalLM",
}
SUPPORTED_GGUF_ARCHITECTURES = tuple(ARCHITECTURES)
QK_PERMUTED = ("llama",)  # architectures whose Q/K rows llama.cpp's converter permutes

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_EXPERT_STACKS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
CORRECTION_BIAS = "mlp.moe_statics.e_score_correction_bias"  # ERNIE-MoE's, from blk.N.exp_probs_b.bias


def hf_tensor_name(gguf_name: str) -> str:
    """Hugging Face name of a GGUF tensor other than an expert stack; ValueError for one we do not know."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    if match and match.group(2) == "exp_probs_b":
        return f"model.layers.{match.group(1)}.{CORRECTION_BIAS}"
    raise ValueError(f"GGUF tensor {gguf_name!r} is not understood by this engine's GGUF loader "
                     f"(architectures {SUPPORTED_GGUF_ARCHITECTURES})")


def hf_tensors(file: GGUFFile) -> Iterator[tuple[str, GGUFTensor]]:
    """(Hugging Face name, tensor) for every tensor of the file, in file order; an expert stack
    (GGUF shape (in, out, E)) becomes E tensors of shape (in, out) whose data are views of its slices."""
    for tensor in file.tensors:
        match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", tensor.name)
        if match and match.group(2) in _EXPERT_STACKS:
            layer, part = match.group(1), _EXPERT_STACKS[match.group(2)]
            if len(tensor.shape) != 3:
                raise ValueError(f"GGUF tensor {tensor.name!r} has shape {tensor.shape}; an expert stack is "
                                 "(in, out, experts)")
            for e in range(tensor.shape[2]):
                yield (f"model.layers.{layer}.mlp.experts.{e}.{part}.weight",
                       GGUFTensor(f"{tensor.name}[{e}]", tensor.tensor_type, tensor.shape[:2], tensor.data[e]))
        else:
            yield hf_tensor_name(tensor.name), tensor


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation. weight: [num_heads * head_dim, hidden] (or [rows])."""
    rows = weight.shape[0]
    w = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


def _rope_scaling(meta, arch: str):
    """config.json's rope_scaling from `{arch}.rope.scaling.*` (None: none); the model build rejects a
    type it does not support (config.py)."""
    kind = meta(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    scaling = {"rope_type": kind, "factor": meta(f"{arch}.rope.scaling.factor", 1.0)}
    original = meta(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = original
    return scaling


def _layers_with(names: set, part: str, layers: int) -> list[int]:
    return [i for i in range(layers) if f"blk.{i}.{part}.weight" in names]


def _moe_config(file: GGUFFile, arch: str, names: set, layers: int) -> dict:
    """The MoE keys of config.json, as Qwen3MoeForCausalLM or Ernie4_5_MoeForCausalLM read them."""
    meta = file.value
    experts, used = meta(f"{arch}.expert_count"), meta(f"{arch}.expert_used_count")
    inter = meta(f"{arch}.expert_feed_forward_length")
    if None in (experts, used, inter):
        raise ValueError(f"GGUF file {file.path} ({arch}) lacks {arch}.expert_count, expert_used_count or "
                         "expert_feed_forward_length")
    sparse = _layers_with(names, "ffn_gate_inp", layers)
    if arch == "qwen3moe":  # llama.cpp renormalises the top-k weights unless the file says otherwise
        return {"num_experts": experts, "num_experts_per_tok": used, "moe_intermediate_size": inter,
                "norm_topk_prob": bool(meta(f"{arch}.expert_weights_norm", True)), "decoder_sparse_step": 1,
                "mlp_only_layers": [i for i in range(layers) if i not in sparse]}
    start, step = meta(f"{arch}.leading_dense_block_count", 0), meta(f"{arch}.interleave_moe_layer_step", 1)
    implied = [i for i in range(start, layers) if (i + 1) % step == 0]
    if sparse != implied:
        raise ValueError(f"GGUF file {file.path}: the layers with a router {sparse} are not those "
                         f"{arch}.leading_dense_block_count={start} and interleave_moe_layer_step={step} imply "
                         f"({implied})")
    shared = meta(f"{arch}.expert_shared_count")
    if shared is None:  # not every converter writes the count: the shared experts' rows then give it
        shexp = f"blk.{sparse[0]}.ffn_up_shexp.weight" if sparse else None
        shared = _tensor_shape(file, shexp)[1] // inter if shexp in names else 0
    for i in sparse if shared else ():
        rows = _tensor_shape(file, f"blk.{i}.ffn_up_shexp.weight")[1]
        if rows != shared * inter:
            raise ValueError(f"GGUF file {file.path}: blk.{i}.ffn_up_shexp.weight has {rows} rows; "
                             f"{arch}.expert_shared_count={shared} experts of {inter} need {shared * inter}")
    return {"moe_num_experts": experts, "moe_k": used, "moe_intermediate_size": inter,
            "moe_layer_start_index": start, "moe_layer_interval": step, "moe_num_shared_experts": shared,
            "moe_use_aux_free": any(f"blk.{i}.exp_probs_b.bias" in names for i in sparse)}


def _tensor_shape(file: GGUFFile, name: str) -> tuple[int, ...]:
    for tensor in file.tensors:
        if tensor.name == name:
            return tensor.shape
    raise ValueError(f"GGUF file {file.path} lacks the tensor {name!r}")


def gguf_hf_config(file: GGUFFile, arch: str) -> dict:
    """config.json of the zoo model for architecture `arch` (a key of ARCHITECTURES) from the metadata."""
    meta = file.value
    heads = meta(f"{arch}.attention.head_count")
    hidden = meta(f"{arch}.embedding_length")
    layers = meta(f"{arch}.block_count")
    names = {t.name for t in file.tensors}
    vocab = meta(f"{arch}.vocab_size") or file.array_length("tokenizer.ggml.tokens")
    has_bias = "blk.0.attn_q.bias" in names
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": meta(f"{arch}.feed_forward_length") or meta(f"{arch}.expert_feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": meta(f"{arch}.attention.head_count_kv", heads),
        "head_dim": meta(f"{arch}.attention.key_length", hidden // heads),
        "rms_norm_eps": meta(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": meta(f"{arch}.rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(meta, arch),
        "max_position_embeddings": meta(f"{arch}.context_length", 2048),
        "tie_word_embeddings": "output.weight" not in names,
    }
    if arch == "qwen3" or arch == "qwen3moe":
        config["attention_bias"] = has_bias
    if arch.startswith("ernie4_5"):
        config["use_bias"] = has_bias
    if arch in ("qwen3moe", "ernie4_5-moe"):
        config.update(_moe_config(file, arch, names, layers))
    return config


def gguf_quant_config(file: GGUFFile):
    """The GGUFConfig of the file's header: the type of every matrix. ValueError naming the tensor and
    its type for a matrix in a type the engine has no kernel for (quantized.py LINEAR_QTYPES) and does
    not read as floats (FLOAT_QTYPES): the IQ, TQ and MXFP4 types."""
    from fastdeploy.model_executor.layers.quantization.gguf import GGUFConfig

    types = {}
    for name, t in hf_tensors(file):
        qtype = int(t.tensor_type)
        if len(t.shape) != 2:
            continue
        if qtype not in LINEAR_QTYPES + FLOAT_QTYPES:
            raise ValueError(f"GGUF tensor {t.name!r} is of type {t.tensor_type.name} ({qtype}), which this engine "
                             f"does not support; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, "
                             f"Q3_K, Q4_K, Q5_K, Q6_K")
        types[name] = qtype
    return GGUFConfig(types)


def _tensor(tensor: GGUFTensor):
    """QuantizedTensor (its blocks, [out, bytes per row]) for a matrix in a type the engine computes on
    (LINEAR_QTYPES), else a float32 array (gguf-py's dequantization: F32, F16, BF16, and 1-D tensors)."""
    import gguf

    if int(tensor.tensor_type) in LINEAR_QTYPES and len(tensor.shape) == 2:
        return QuantizedTensor(np.asarray(tensor.data), int(tensor.tensor_type), int(tensor.shape[0]))
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)


def iter_gguf_tensors(file: GGUFFile, hf_config: dict) -> Iterator[tuple[str, object]]:
    """(HF name, float32 array or QuantizedTensor) for every tensor, as `hf_tensors` names them; Q/K rows
    unpermuted for the architectures in QK_PERMUTED, the correction bias as [1, experts]."""
    permuted = hf_config["architectures"][0] in {ARCHITECTURES[a] for a in QK_PERMUTED}
    heads = {"q_proj.weight": hf_config["num_attention_heads"], "k_proj.weight": hf_config["num_key_value_heads"]}
    for name, tensor in hf_tensors(file):
        array = _tensor(tensor)
        for suffix, count in heads.items() if permuted else ():
            if name.endswith(suffix) and isinstance(array, QuantizedTensor):
                array = QuantizedTensor(unpermute_qk(array.blocks, count), array.qtype, array.in_features)
            elif name.endswith(suffix):
                array = unpermute_qk(array, count)
        if name.endswith(CORRECTION_BIAS):
            array = array.reshape(1, -1)
        yield name, array
        file.release(tensor)  # copied into the model by now: its mapped pages leave this process's RSS


def open_gguf(path: Path) -> ModelSource:
    """The ModelSource of a GGUF file; ValueError for a bad file (gguf_file.py), an architecture not in
    SUPPORTED_GGUF_ARCHITECTURES, or MoE metadata that disagrees with the file's tensors."""
    file = GGUFFile(path)
    arch = file.value("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} in {path} is not supported; supported: {SUPPORTED_GGUF_ARCHITECTURES}"
        )
    hf_config = gguf_hf_config(file, arch)
    return ModelSource(
        hf_config=hf_config,
        generation_config={},
        path=path,
        gguf_file=file,
        weights=lambda: iter_gguf_tensors(file, hf_config),
        quant_config=gguf_quant_config(file),
    )
