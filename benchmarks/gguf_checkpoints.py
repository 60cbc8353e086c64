"""Random-weight GGUF files of real models' shapes, for benchmarks that run our engine and llama.cpp on one file.

    python benchmarks/gguf_checkpoints.py ernie-21b-a3b Q4_K_M [--dir DIR] [--check]

writes (once; an existing file is reused) DIR/<shape>-<quant>.gguf, DIR defaulting to
~/.cache/fastdeploy-bench, with gguf-py's GGUFWriter, one tensor at a time (never the whole file in
memory). --check loads it with llama.cpp (llama-cpp-python) and decodes a few tokens: the logits must be
finite and not all equal.

Shapes (SHAPES; `general.architecture` as llama.cpp names it, metadata keys and tensor names as its
loader reads them):
  * ernie-21b-a3b: ERNIE-4.5-21B-A3B (`ernie4_5-moe`): hidden 2560, 28 layers, 20 heads / 4 KV heads of
    128, vocab 103424, tied embeddings; layer 0 dense (intermediate 12288), layers 1-27 MoE: 64 experts
    of 1536, 6 per token, 2 shared experts stored as one of 3072 (`ffn_*_shexp`), as llama.cpp's
    converter writes them, and the router's score bias (`exp_probs_b`, zeros). Values from
    transformers' Ernie4_5_MoeConfig defaults (the 21B-A3B configuration).
  * qwen3-30b-a3b: Qwen3-30B-A3B (`qwen3moe`): hidden 2048, 48 layers, 32 heads / 4 KV heads of 128,
    q/k RMSNorm, every layer MoE with 128 experts of 768, 8 per token, vocab 151936, untied lm_head.
  * ernie-0.3b: ERNIE-4.5-0.3B (`ernie4_5`): the shapes of benchmark_load_ernie.py (hidden 1024, 18
    layers, 16 heads / 2 KV heads of 128, intermediate 3072, vocab 103424, tied).
  * llama-small (~335 M parameters, ~356 MB in Q8_0), llama-2b (~2.0 B, ~2.1 GB in Q8_0): `llama`
    shapes for what our engine loads today and for measuring memory while loading.

Quant mixes (QUANTS): Q8_0 and Q4_0 put every matrix in that type (llama.cpp's --pure, less its
Q6_K output tensor). Q4_K_M follows llama.cpp's src/llama-quant.cpp for that file type: Q4_K by default;
Q6_K for output.weight (token_embd.weight when the embeddings are tied, which then is the output), for
attn_v and for every ffn_down tensor (dense, experts, shared experts) of the layers where its
`use_more_bits` holds (the first and last eighth of the layers, and every third in between). Left
out: its Q8_0 for attn_k / attn_v of 8-expert models (none here) and its fallbacks for rows that are
not whole 256-blocks (every matrix here has whole blocks). Norms, the MoE router (`ffn_gate_inp`) and
the score bias are float32, as llama.cpp leaves them.

Weights are random but valid blocks: random quant bytes and small positive float16 scales (d, and for
Q4_K a dmin that centres the values), scaled so each matrix's values have a standard deviation near
WEIGHT_STD; norms are ones. The tokenizer is a byte-level BPE (`gpt2`, pre `qwen2`) of the shape's
vocabulary size: the 256 byte tokens, filler tokens of letters, a few merges, and special tokens at the
end (EOS, BOS); ERNIE's real files use a SentencePiece `llama` vocabulary instead, which makes no
difference to a benchmark fed token ids.
"""
import argparse
import math
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

DEFAULT_DIR = Path.home() / ".cache" / "fastdeploy-bench"
WEIGHT_STD = 0.02

_ERNIE_03B = dict(arch="ernie4_5", hidden=1024, layers=18, heads=16, kv_heads=2, head_dim=128, ffn=3072,
                  vocab=103424, tied=True, rope_theta=500000.0, eps=1e-5, context=131072)
SHAPES = {
    "ernie-21b-a3b": dict(arch="ernie4_5-moe", hidden=2560, layers=28, heads=20, kv_heads=4, head_dim=128,
                          ffn=12288, vocab=103424, tied=True, rope_theta=500000.0, eps=1e-5, context=131072,
                          experts=64, experts_used=6, expert_ffn=1536, shared_ffn=2 * 1536, dense_lead=1,
                          score_bias=True),
    "qwen3-30b-a3b": dict(arch="qwen3moe", hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, ffn=6144,
                          vocab=151936, tied=False, rope_theta=1000000.0, eps=1e-6, context=40960,
                          experts=128, experts_used=8, expert_ffn=768, qk_norm=True),
    "ernie-0.3b": _ERNIE_03B,
    "llama-small": dict(arch="llama", hidden=1024, layers=24, heads=16, kv_heads=4, head_dim=64, ffn=2816,
                        vocab=32000, tied=False, rope_theta=10000.0, eps=1e-5, context=4096),
    "llama-2b": dict(arch="llama", hidden=3072, layers=18, heads=24, kv_heads=8, head_dim=128, ffn=8192,
                     vocab=32000, tied=False, rope_theta=10000.0, eps=1e-5, context=4096),
}
QUANTS = {"Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
          "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}
# where the float16 scales sit in each block type (ggml's block structs): d, and dmin for Q4_K
_SCALE_OFFSETS = {T.Q4_0: (0,), T.Q8_0: (0,), T.Q4_K: (0, 2), T.Q6_K: (208,)}
_CHUNK_BLOCKS = 1 << 20  # blocks generated per numpy call (~140-210 MB for K-quants)


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's rule for the layers whose attn_v / ffn_down get more bits in Q4_K_M."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def matrix_type(name: str, layer: int, shape: dict, quant: str) -> T:
    """The ggml type of matrix `name` (GGUF name) of `layer` (-1: not in a layer) in mix `quant`."""
    if quant != "Q4_K_M":
        return T[quant]
    output = name == "output.weight" or (name == "token_embd.weight" and shape["tied"])
    more = ".attn_v." in name or ".ffn_down" in name
    return T.Q6_K if output or (more and use_more_bits(layer, shape["layers"])) else T.Q4_K


def tensor_plan(shape: dict) -> list[tuple[str, tuple[int, ...], int, str]]:
    """(GGUF name, numpy shape [slowest .. row length], layer or -1, kind) of every tensor, in file order;
    kind: "matrix" (quantized), "norm" (float32 ones), "router" (float32 random), "bias" (float32 zeros)."""
    h, hd, e = shape["hidden"], shape["head_dim"], shape.get("experts", 0)
    plan = [("token_embd.weight", (shape["vocab"], h), -1, "matrix")]
    for i in range(shape["layers"]):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (h,), i, "norm"),
                 (b + "attn_q.weight", (shape["heads"] * hd, h), i, "matrix"),
                 (b + "attn_k.weight", (shape["kv_heads"] * hd, h), i, "matrix"),
                 (b + "attn_v.weight", (shape["kv_heads"] * hd, h), i, "matrix"),
                 (b + "attn_output.weight", (h, shape["heads"] * hd), i, "matrix"),
                 (b + "ffn_norm.weight", (h,), i, "norm")]
        if shape.get("qk_norm"):
            plan += [(b + "attn_q_norm.weight", (hd,), i, "norm"), (b + "attn_k_norm.weight", (hd,), i, "norm")]
        if e and i >= shape.get("dense_lead", 0):
            f = shape["expert_ffn"]
            plan += [(b + "ffn_gate_inp.weight", (e, h), i, "router"),
                     (b + "ffn_gate_exps.weight", (e, f, h), i, "matrix"),
                     (b + "ffn_up_exps.weight", (e, f, h), i, "matrix"),
                     (b + "ffn_down_exps.weight", (e, h, f), i, "matrix")]
            if shape.get("score_bias"):
                plan.append((b + "exp_probs_b.bias", (e,), i, "bias"))
            if shape.get("shared_ffn"):
                s = shape["shared_ffn"]
                plan += [(b + "ffn_gate_shexp.weight", (s, h), i, "matrix"),
                         (b + "ffn_up_shexp.weight", (s, h), i, "matrix"),
                         (b + "ffn_down_shexp.weight", (h, s), i, "matrix")]
        else:
            plan += [(b + "ffn_gate.weight", (shape["ffn"], h), i, "matrix"),
                     (b + "ffn_up.weight", (shape["ffn"], h), i, "matrix"),
                     (b + "ffn_down.weight", (h, shape["ffn"]), i, "matrix")]
    plan.append(("output_norm.weight", (h,), -1, "norm"))
    if not shape["tied"]:
        plan.append(("output.weight", (shape["vocab"], h), -1, "matrix"))
    return plan


def _blocks(qtype: T, count: int, rng: np.random.Generator, d: float) -> np.ndarray:
    """[count, block bytes] random blocks of `qtype` with scale d (Q4_K: dmin = 7.5 d, centring its values
    around 0; Q6_K: its int8 sub-block scales drawn from 1..15 rather than all of int8)."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = np.frombuffer(rng.bytes(count * size), np.uint8).reshape(count, size).copy()
    if qtype == T.Q6_K:
        blocks[:, 192:208] = rng.integers(1, 16, (count, 16), dtype=np.uint8)
    for offset, value in zip(_SCALE_OFFSETS[qtype], [d, 7.5 * d]):
        blocks[:, offset:offset + 2] = np.array([value], np.float16).view(np.uint8)[None, :]
    return blocks


_UNIT_STD: dict = {}


def _d_for(qtype: T) -> float:
    """The scale d giving values of std WEIGHT_STD (measured once per type with gguf-py's dequantize)."""
    if qtype not in _UNIT_STD:
        sample = _blocks(qtype, 4096, np.random.default_rng(0), 1.0)
        _UNIT_STD[qtype] = float(gguf.quants.dequantize(sample, qtype).std())
    return WEIGHT_STD / _UNIT_STD[qtype]


def random_blocks(qtype: T, numpy_shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks for a tensor of `numpy_shape` values: uint8 [..., row bytes], as gguf-py lays
    out quantized data; values of std ~WEIGHT_STD."""
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows, row_len = math.prod(numpy_shape[:-1]), numpy_shape[-1]
    if row_len % block_values:
        raise ValueError(f"rows of {row_len} values are not whole {qtype.name} blocks of {block_values}")
    count = rows * row_len // block_values
    out = np.empty((count, block_bytes), np.uint8)
    for start in range(0, count, _CHUNK_BLOCKS):
        out[start:start + _CHUNK_BLOCKS] = _blocks(qtype, min(_CHUNK_BLOCKS, count - start), rng, _d_for(qtype))
    return out.reshape(*numpy_shape[:-1], row_len // block_values * block_bytes)


def _tokenizer(writer: gguf.GGUFWriter, vocab: int) -> None:
    """A byte-level BPE vocabulary of `vocab` tokens: bytes, letter fillers, EOS and BOS last."""
    byte_chars = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + \
        [chr(c) for c in range(174, 256)]
    byte_chars += [chr(256 + i) for i in range(256 - len(byte_chars))]  # GPT-2's bytes_to_unicode, in its order
    letters = "abcdefghijklmnopqrstuvwxyz"
    fillers = []
    width = 2
    while len(fillers) < vocab - 256 - 2:
        for i in range(26 ** width):
            word = "".join(letters[(i // 26 ** k) % 26] for k in range(width))
            fillers.append(word)
            if len(fillers) == vocab - 256 - 2:
                break
        width += 1
    tokens = byte_chars + fillers + ["<|endoftext|>", "<|begin_of_text|>"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (vocab - 2) + [gguf.TokenType.CONTROL] * 2)
    writer.add_token_merges([f"{a} {b}" for a, b in ("aa", "ab", "ba", "bb")])  # "aa", "ab", ... are fillers
    writer.add_eos_token_id(vocab - 2)
    writer.add_bos_token_id(vocab - 1)
    writer.add_add_bos_token(False)


def _metadata(writer: gguf.GGUFWriter, shape: dict, quant: str, name: str) -> None:
    writer.add_name(f"random {name}")
    writer.add_file_type(int(QUANTS[quant]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(shape["vocab"])
    writer.add_context_length(shape["context"])
    writer.add_embedding_length(shape["hidden"])
    writer.add_block_count(shape["layers"])
    writer.add_feed_forward_length(shape["ffn"])
    writer.add_head_count(shape["heads"])
    writer.add_head_count_kv(shape["kv_heads"])
    writer.add_key_length(shape["head_dim"])
    writer.add_value_length(shape["head_dim"])
    writer.add_rope_dimension_count(shape["head_dim"])
    writer.add_rope_freq_base(shape["rope_theta"])
    writer.add_layer_norm_rms_eps(shape["eps"])
    if shape.get("experts"):
        writer.add_expert_count(shape["experts"])
        writer.add_expert_used_count(shape["experts_used"])
        writer.add_expert_feed_forward_length(shape["expert_ffn"])
    if shape["arch"] == "ernie4_5-moe":
        writer.add_leading_dense_block_count(shape["dense_lead"])
        writer.add_interleave_moe_layer_step(1)
        writer.add_expert_shared_feed_forward_length(shape["shared_ffn"])
    _tokenizer(writer, shape["vocab"])


def write(path: Path, shape: dict, quant: str, name: str, seed: int = 0) -> None:
    """Write a random GGUF of `shape` (a SHAPES value, or one like it) in mix `quant` (QUANTS key) to `path`,
    a tensor at a time (through a temporary name, so an interrupted run leaves no half file under `path`);
    `name`: its general.name."""
    plan = tensor_plan(shape)
    types = {n: (matrix_type(n, layer, shape, quant) if kind == "matrix" else T.F32) for n, _, layer, kind in plan}
    partial = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(partial), shape["arch"])
    _metadata(writer, shape, quant, name)
    for n, dims, _, _ in plan:
        qtype = types[n]
        size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = math.prod(dims) // size[0] * size[1]
        # a float dtype: gguf-py then takes `dims` as values, not bytes
        writer.add_tensor_info(n, dims, np.dtype(np.float32), nbytes, raw_dtype=None if qtype == T.F32 else qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for n, dims, _, kind in plan:
        if kind == "matrix":
            data = random_blocks(types[n], dims, rng)
        elif kind == "router":
            data = rng.normal(0, WEIGHT_STD, dims).astype(np.float32)
        else:
            data = np.full(dims, 1.0 if kind == "norm" else 0.0, np.float32)
        writer.write_tensor_data(data)
        del data
    writer.close()
    partial.rename(path)


def checkpoint(name: str, quant: str, directory: Path = DEFAULT_DIR) -> Path:
    """The path of the `name` / `quant` file under `directory`, written first if it is not there.
    ValueError for an unknown shape or mix."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {sorted(SHAPES)}")
    if quant not in QUANTS:
        raise ValueError(f"unknown quant mix {quant!r}; known: {sorted(QUANTS)}")
    path = Path(directory) / f"{name}-{quant}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} (once)", flush=True)
        write(path, SHAPES[name], quant, name)
    return path


def check_with_llama_cpp(path: Path, threads: int = 2) -> np.ndarray:
    """Load `path` with llama.cpp, decode 8 tokens after a 16-token prompt and return the last logits;
    RuntimeError when they are not finite or all equal."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import engines_optional

    engine = engines_optional.LlamaCpp(path, 1, 64, threads)
    engine.generate([list(range(300, 316))], 8)
    logits = np.ctypeslib.as_array(engine.lc.llama_get_logits_ith(engine.ctx, 0), shape=(engine.n_vocab,)).copy()
    if not np.isfinite(logits).all() or logits.std() == 0:
        raise RuntimeError(f"llama.cpp's logits on {path} are not usable: finite {np.isfinite(logits).mean():.3f}, "
                           f"std {np.nanstd(logits)}")
    return logits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("quant", choices=sorted(QUANTS))
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help=f"cache folder (default {DEFAULT_DIR})")
    ap.add_argument("--check", action="store_true", help="decode a few tokens with llama.cpp; logits must be finite")
    args = ap.parse_args()
    path = checkpoint(args.shape, args.quant, Path(args.dir))
    print(f"{path}: {path.stat().st_size / 2**30:.2f} GiB", flush=True)
    if args.check:
        logits = check_with_llama_cpp(path)
        print(f"llama.cpp logits finite: mean {logits.mean():.3f}, std {logits.std():.3f}, "
              f"max |x| {np.abs(logits).max():.3f}")


if __name__ == "__main__":
    main()
