"""Open a llama.cpp GGUF file: config and tokenizer from its metadata, tensors by Hugging Face names.

Matrices in Q4_0, Q4_1 or Q8_0 come as `QuantizedTensor` (their blocks; the model keeps them
quantized when it can compute on them, see layers/quantization/gguf.py, deciding so at build from
the header's tensor types: `gguf_quant_config`); other tensors are dequantized to float32 with the
`gguf` package.
llama.cpp's converter permutes the rows of Llama's Q and K projections (to turn the rotate-half
RoPE layout into the interleaved one it computes with); `unpermute_qk` undoes it, as
transformers' GGUF loader does.
"""
import re
from pathlib import Path
from typing import Iterator

import numpy as np

from fastdeploy.model_executor.model_loader.gguf_file import GGUFFile, GGUFTensor
from fastdeploy.model_executor.model_loader.quantized import FLOAT_QTYPES, LINEAR_QTYPES, QuantizedTensor
from fastdeploy.model_executor.model_loader.source import ModelSource

SUPPORTED_GGUF_ARCHITECTURES = ("llama",)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_tensor_name(gguf_name: str) -> str:
    """Hugging Face name of a GGUF tensor; raises ValueError for a tensor we do not know."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    raise ValueError(f"GGUF tensor {gguf_name!r} is not understood by this engine's Llama loader")


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation. weight: [num_heads * head_dim, hidden] (or [rows])."""
    rows = weight.shape[0]
    w = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


def gguf_hf_config(file: GGUFFile, arch: str) -> dict:
    meta = file.value
    heads = meta(f"{arch}.attention.head_count")
    hidden = meta(f"{arch}.embedding_length")
    names = {t.name for t in file.tensors}
    vocab = meta(f"{arch}.vocab_size") or file.array_length("tokenizer.ggml.tokens")
    return {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": meta(f"{arch}.feed_forward_length"),
        "num_hidden_layers": meta(f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta(f"{arch}.attention.head_count_kv", heads),
        "head_dim": meta(f"{arch}.attention.key_length", hidden // heads),
        "rms_norm_eps": meta(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": meta(f"{arch}.rope.freq_base", 10000.0),
        "max_position_embeddings": meta(f"{arch}.context_length", 2048),
        "tie_word_embeddings": "output.weight" not in names,
    }


def gguf_quant_config(file: GGUFFile):
    """The GGUFConfig of the file's header: the type of every matrix. ValueError naming the tensor and
    its type for a matrix in a type the engine has no kernel for (quantized.py LINEAR_QTYPES) and does
    not read as floats (FLOAT_QTYPES): the IQ, TQ and MXFP4 types."""
    from fastdeploy.model_executor.layers.quantization.gguf import GGUFConfig

    types = {}
    for t in file.tensors:
        qtype = int(t.tensor_type)
        if len(t.shape) != 2:
            continue
        if qtype not in LINEAR_QTYPES + FLOAT_QTYPES:
            raise ValueError(f"GGUF tensor {t.name!r} is of type {t.tensor_type.name} ({qtype}), which this engine "
                             f"does not support; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, "
                             f"Q3_K, Q4_K, Q5_K, Q6_K")
        types[hf_tensor_name(t.name)] = qtype
    return GGUFConfig(types)


def _tensor(tensor: GGUFTensor):
    """QuantizedTensor (its blocks, [out, bytes per row]) for a matrix in a type the engine computes on
    (LINEAR_QTYPES), else a float32 array (gguf-py's dequantization: F32, F16, BF16, and 1-D tensors)."""
    import gguf

    if int(tensor.tensor_type) in LINEAR_QTYPES and len(tensor.shape) == 2:
        return QuantizedTensor(np.asarray(tensor.data), int(tensor.tensor_type), int(tensor.shape[0]))
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)


def iter_gguf_tensors(file: GGUFFile, hf_config: dict) -> Iterator[tuple[str, object]]:
    for tensor in file.tensors:
        name, array = hf_tensor_name(tensor.name), _tensor(tensor)
        heads = {"q_proj.weight": hf_config["num_attention_heads"], "k_proj.weight": hf_config["num_key_value_heads"]}
        for suffix, count in heads.items():
            if name.endswith(suffix) and isinstance(array, QuantizedTensor):
                array = QuantizedTensor(unpermute_qk(array.blocks, count), array.qtype, array.in_features)
            elif name.endswith(suffix):
                array = unpermute_qk(array, count)
        yield name, array


def open_gguf(path: Path) -> ModelSource:
    """The ModelSource of a GGUF file; ValueError for a bad file (gguf_file.py) or an architecture
    other than SUPPORTED_GGUF_ARCHITECTURES."""
    file = GGUFFile(path)
    arch = file.value("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
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
