"""Tiny random GGUF files of each llama.cpp architecture, and the Hugging Face checkpoint each means.

`write_gguf(path, arch, qtype)` saves a random transformers model of the zoo class of `arch`, then
writes its tensors into a GGUF file as llama.cpp's converter (convert_hf_to_gguf.py) would: names
from gguf-py's own tensor map (`gguf.get_tensor_name_map`, the converter's), experts stacked into
[E, rows, cols] tensors, Llama's Q/K rows permuted, the metadata keys the converter writes (through
GGUFWriter's add_* methods), the tiny byte-level tokenizer as a `gpt2` vocabulary. Every matrix
(embedding and lm_head included, not the MoE router, which llama.cpp keeps in F32) is stored in
`qtype`; 1-D tensors (norms, biases, ERNIE's correction bias) in F32.

F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_1 are quantized from the model's weights by gguf-py. gguf-py has
no quantizer for the K-quants (Q2_K..Q6_K): their blocks are random bytes with small positive
float16 scales d (and dmin, chosen so that each block's mean is 0), scaled so that the dequantized
matrix has the model's initializer std (`random_k_blocks`).

The oracle checkpoint (the saved directory, its safetensors rewritten) holds what the file holds as
gguf-py's `dequantize` gives it, Q/K rows permuted back for Llama: transformers on it computes the
function the GGUF file describes.
"""
from pathlib import Path

import gguf
import numpy as np

from tiny_llama import VOCAB_SIZE, write_tokenizer
from tiny_models import edit_safetensors, randomize_biases_and_norms

Q = gguf.GGMLQuantizationType
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
BLOCK_TYPES = (Q.Q8_0, Q.Q4_0, Q.Q4_1)  # gguf-py quantizes these
K_TYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q3_K)  # random blocks
# byte offsets of the float16 scales d (and dmin) in a block of each K type (ggml-common.h's block_q*_K)
K_SCALE_OFFSETS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
INIT_STD = 0.05

# K-quant rows are blocks of 256 weights, so every matrix's in_features is a multiple of 256
COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=512, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=512, initializer_range=INIT_STD,
              bos_token_id=1, eos_token_id=2, pad_token_id=2)
NUM_EXPERTS, TOP_K = 4, 2

# llama.cpp architecture -> (transformers config class, model class, config overrides)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(num_hidden_layers=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 50000.0})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(num_hidden_layers=2, rms_norm_eps=1e-6, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(num_hidden_layers=2, rms_norm_eps=1e-6, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                 dict(num_hidden_layers=2, rms_norm_eps=1e-6, tie_word_embeddings=False, num_experts=NUM_EXPERTS,
                      num_experts_per_tok=TOP_K, moe_intermediate_size=256, norm_topk_prob=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM",
                 dict(num_hidden_layers=2, rms_norm_eps=1e-5, use_bias=False, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    # layer 0 dense (moe_layer_start_index), layers 1 and 2 MoE with one shared expert
    "ernie4_5-moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
                     dict(num_hidden_layers=3, rms_norm_eps=1e-5, use_bias=False, tie_word_embeddings=False,
                          moe_num_experts=NUM_EXPERTS, moe_k=TOP_K, moe_intermediate_size=256,
                          moe_layer_start_index=1, moe_num_shared_experts=1,
                          rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
}
GGUF_ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3,
             "qwen3moe": gguf.MODEL_ARCH.QWEN3MOE, "ernie4_5": gguf.MODEL_ARCH.ERNIE4_5,
             "ernie4_5-moe": gguf.MODEL_ARCH.ERNIE4_5_MOE}
PRE_TOKENIZER = {"llama": "llama-bpe"}  # the others: "qwen2" (ERNIE's files carry a SentencePiece vocabulary;
# the model tests here need only a working one)


def make_hf_model(path: Path, arch: str, seed: int = 0):
    """Save a random transformers model of `arch` at `path` (with tiny_llama's tokenizer); returns its config."""
    import torch
    import transformers

    config_cls, model_cls, overrides = ARCHS[arch]
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**COMMON, **overrides)
    model = getattr(transformers, model_cls)(config).eval()
    randomize_biases_and_norms(model, seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("e_score_correction_bias"):  # large enough to change expert choices
                param.normal_(0, 0.1)
    model.save_pretrained(str(path))
    write_tokenizer(path)
    return config


def converter_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's Q/K row order for Llama (LlamaModel.permute): per head, the rotate-half
    pairs (i, i + d/2) become neighbours."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def converter_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of converter_permute, as the permutation's argsort."""
    order = converter_permute(np.arange(w.shape[0]), n_head)
    return w[np.argsort(order)]


def _set_half(blocks: np.ndarray, offset: int, values: np.ndarray) -> None:
    blocks[..., offset:offset + 2] = values.astype(np.float16).view(np.uint8).reshape(*values.shape, 2)


def _per_block(blocks: np.ndarray, qtype) -> np.ndarray:
    """gguf-py's dequantization of [..., blocks, bytes] as [..., blocks, 256]."""
    flat = blocks.reshape(*blocks.shape[:-2], -1)
    return gguf.quants.dequantize(flat, qtype).reshape(*blocks.shape[:-1], -1)


def random_k_blocks(rows_shape: tuple, cols: int, qtype, rng) -> np.ndarray:
    """Valid random blocks of K-quant `qtype` for a [*rows_shape, cols] matrix, dequantizing to mean ~0
    and std INIT_STD.

    Random quants and (unsigned) sub-block scales have a positive mean; where the type subtracts minimums
    (dmin: Q2_K, Q4_K, Q5_K), each block's dmin is chosen so that its mean is 0 (weights of one sign
    would make every row of lm_head favour the same tokens). The result is y = d * A - dmin * B per
    block, A and B dequantized with (d, dmin) = (1, 0) and (0, -1)."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(*rows_shape, cols // block_elems, block_bytes), dtype=np.uint8)
    offsets = K_SCALE_OFFSETS[qtype]
    one, zero = np.ones(blocks.shape[:-1]), np.zeros(blocks.shape[:-1])
    d = rng.uniform(0.5, 1.0, size=blocks.shape[:-1])
    if len(offsets) == 2:
        _set_half(blocks, offsets[0], one), _set_half(blocks, offsets[1], zero)
        a = _per_block(blocks, qtype).mean(axis=-1)
        _set_half(blocks, offsets[0], zero), _set_half(blocks, offsets[1], -one)
        b = _per_block(blocks, qtype).mean(axis=-1)
        dmin = np.where(b > 0, d * a / np.maximum(b, 1e-6), 0.0)
        _set_half(blocks, offsets[1], dmin)
    _set_half(blocks, offsets[0], d)
    scale = INIT_STD / float(_per_block(blocks, qtype).std())
    for offset in offsets:
        field = np.ascontiguousarray(blocks[..., offset:offset + 2]).view(np.float16)[..., 0]
        _set_half(blocks, offset, field.astype(np.float32) * scale)
    return blocks.reshape(*rows_shape, -1)


def encode(array: np.ndarray, qtype, rng) -> np.ndarray:
    """What the file stores for float32 `array` [..., cols] in `qtype` (numbers for F32/F16, else bytes)."""
    if qtype == Q.F32:
        return array.astype(np.float32)
    if qtype == Q.F16:
        return array.astype(np.float16)
    if qtype in K_TYPES:
        return random_k_blocks(array.shape[:-1], array.shape[-1], qtype, rng)
    return gguf.quants.quantize(array.astype(np.float32), qtype)


def decode(stored: np.ndarray, qtype) -> np.ndarray:
    if qtype in (Q.F32, Q.F16):
        return stored.astype(np.float32)
    return gguf.quants.dequantize(stored, qtype).astype(np.float32)


def _stack_experts(tensors: dict) -> dict:
    """Per-expert HF tensors merged into [E, rows, cols] stacks named ...mlp.experts.<proj>.weight, as the
    converter does before mapping names."""
    out, stacks = {}, {}
    for name, array in tensors.items():
        head, sep, tail = name.partition(".mlp.experts.")
        if not sep:
            out[name] = array
            continue
        expert, proj = tail.split(".", 1)
        stacks.setdefault(f"{head}.mlp.experts.{proj}", {})[int(expert)] = array
    for name, experts in stacks.items():
        out[name] = np.stack([experts[e] for e in sorted(experts)])
    return out


def _write_metadata(writer, arch: str, config, tokenizer_dir: Path) -> None:
    c = config
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    if arch == "qwen3moe":
        writer.add_expert_count(c.num_experts)
        writer.add_expert_used_count(c.num_experts_per_tok)
        writer.add_expert_feed_forward_length(c.moe_intermediate_size)
    if arch == "ernie4_5-moe":
        writer.add_expert_count(c.moe_num_experts)
        writer.add_expert_used_count(c.moe_k)
        writer.add_interleave_moe_layer_step(c.moe_layer_interval)
        writer.add_leading_dense_block_count(c.moe_layer_start_index)
        writer.add_expert_feed_forward_length(c.moe_intermediate_size)
        writer.add_expert_shared_count(c.moe_num_shared_experts)
        writer.add_expert_shared_feed_forward_length(c.moe_intermediate_size * c.moe_num_shared_experts)
    _write_tokenizer(writer, arch, tokenizer_dir)


def _write_tokenizer(writer, arch: str, tokenizer_dir: Path) -> None:
    """tiny_llama's byte-level BPE tokenizer as a `gpt2` vocabulary (tokens, merges, token types)."""
    import json

    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    tokens = [f"[PAD{i}]" for i in range(VOCAB_SIZE)]  # ids the trained vocabulary leaves free, as llama.cpp pads
    for token, index in vocab.items():
        tokens[index] = token
    special = {t["id"] for t in spec["added_tokens"]}
    for t in spec["added_tokens"]:
        tokens[t["id"]] = t["content"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZER.get(arch, "qwen2"))
    writer.add_token_list(tokens)
    unused = set(range(VOCAB_SIZE)) - set(vocab.values()) - special
    writer.add_token_types([3 if i in special else 5 if i in unused else 1 for i in range(VOCAB_SIZE)])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template((tokenizer_dir / "chat_template.jinja").read_text())


class Mix:
    """A per-matrix choice of types as llama.cpp's K_M files make one: `base` for every matrix but those
    whose HF name holds a key of `parts`, which get its type."""

    def __init__(self, name: str, base, parts: dict):
        self.name, self.base, self.parts = name, base, parts

    def type_of(self, hf_name: str):
        return next((t for piece, t in self.parts.items() if piece in hf_name), self.base)


# q / k / v in three types and gate / up in two, so packed projections hold segments of several types
Q4_K_M_LIKE = Mix("Q4_K_M_like", Q.Q4_K, {"k_proj": Q.Q8_0, "v_proj": Q.Q6_K, "up_proj": Q.Q5_K,
                                         "down_proj": Q.Q6_K})


def write_gguf(path: Path, arch: str, qtype, seed: int = 0) -> tuple[Path, Path]:
    """(GGUF file, oracle checkpoint directory) for `arch` (a key of ARCHS) with its matrices in `qtype`
    (a type, or a Mix)."""
    from safetensors.numpy import load_file

    oracle_dir = path / "oracle"
    config = make_hf_model(oracle_dir, arch, seed)
    tensors = _stack_experts(load_file(str(oracle_dir / "model.safetensors")))
    name_map = gguf.get_tensor_name_map(GGUF_ARCH[arch], config.num_hidden_layers)
    rng = np.random.default_rng(seed)
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    file = path / f"{arch}-{qtype.name}.gguf"
    writer = gguf.GGUFWriter(str(file), gguf.MODEL_ARCH_NAMES[GGUF_ARCH[arch]])
    _write_metadata(writer, arch, config, oracle_dir)
    oracle = {}
    for name, array in tensors.items():
        array = array.astype(np.float32)
        gguf_name = name_map.get_name(name.replace("e_score_correction_bias", "e_score_correction.bias"),
                                      try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        permute = arch == "llama" and name.rsplit(".", 2)[-2] in heads
        count = heads.get(name.rsplit(".", 2)[-2])
        if permute:
            array = converter_permute(array, count)
        kind = (Q.F32 if array.ndim == 1 or ".mlp.gate." in name or "e_score" in name else
                qtype.type_of(name) if isinstance(qtype, Mix) else qtype)
        stored = encode(array, kind, rng)
        writer.add_tensor(gguf_name, stored, raw_dtype=None if kind in (Q.F32, Q.F16) else kind)
        value = decode(stored, kind).reshape(array.shape)
        oracle[name] = converter_unpermute(value, count) if permute else value
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    def unstack(checkpoint: dict) -> None:
        for name in list(checkpoint):
            head, sep, tail = name.partition(".mlp.experts.")
            if sep:
                expert, proj = tail.split(".", 1)
                checkpoint[name] = oracle[f"{head}.mlp.experts.{proj}"][int(expert)]
            else:
                checkpoint[name] = oracle[name].reshape(checkpoint[name].shape)

    edit_safetensors(oracle_dir, unstack)
    return file, oracle_dir
