"""Random embedding checkpoints of bge-base's and Qwen3-Embedding-0.6B's shapes, and texts of chosen token lengths.

Both are written as the hub repositories lay them out, with locally built tokenizers (no downloads):
  * "bge": `BertModel` (12 layers, hidden 768, 12 heads, intermediate 3072, vocab 30522, 512 positions,
    float32 safetensors like BAAI/bge-base-en-v1.5), a lower-casing WordPiece tokenizer that adds
    [CLS] ... [SEP], and sentence-transformers' modules.json: Transformer, Pooling (CLS), Normalize.
  * "qwen3": `Qwen3ForCausalLM` (28 layers, hidden 1024, 16 heads / 8 KV heads of 128, intermediate 3072,
    vocab 151669, tied embeddings, bf16 safetensors like Qwen/Qwen3-Embedding-0.6B), a byte-level BPE
    with Qwen2's split regex whose post-processor appends <|endoftext|>, and modules.json: Transformer,
    Pooling (last token), Normalize.
The sentence-transformers files use the hub's layout (`sentence_transformers.models.*` module types,
`pooling_mode_*` flags), as both real repositories do. Weights are transformers' initialisation under a
fixed seed. The vocabularies are synthetic: consonant-vowel syllables and words made of them, so the
texts (words of those syllables) tokenize to known lengths; content does not matter to random weights.
Imports torch and transformers only inside the writers; nothing here imports paddle.
"""
import itertools
import json
import math
import random
from pathlib import Path

SHAPES = {
    "bge": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                pad_token_id=0),
    "qwen3": dict(vocab_size=151669, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, intermediate_size=3072, max_position_embeddings=32768,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643),
}
DIR_NAMES = {"bge": "bge-base-random", "qwen3": "qwen3-embedding-0.6b-random"}
CONSONANTS, VOWELS = "bcdfghjklmnprstvwz", "aeiou"
QWEN_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
              r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN_BASE_VOCAB = 151643  # BPE entries before the added tokens, as in Qwen3's tokenizer
QWEN_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def syllables() -> list[str]:
    return [c + v for c in CONSONANTS for v in VOWELS]


def words(n_syllables: int):
    """All words of `n_syllables` syllables, in a fixed order."""
    return ("".join(p) for p in itertools.product(syllables(), repeat=n_syllables))


def checkpoint(shape: str, cache_dir: Path, config_overrides: dict | None = None) -> Path:
    """The directory of `shape`'s random checkpoint under cache_dir, written once (a `.partial` directory
    renamed when complete). config_overrides (e.g. fewer layers) gives another directory name."""
    name = DIR_NAMES[shape] + "".join(f"-{k}{v}" for k, v in sorted((config_overrides or {}).items()))
    out = Path(cache_dir) / name
    if (out / "modules.json").is_file():
        return out
    partial = out.with_name(out.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    {"bge": write_bge, "qwen3": write_qwen3}[shape](partial, {**SHAPES[shape], **(config_overrides or {})})
    partial.rename(out)
    return out


def write_bge(path: Path, shape: dict) -> None:
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    specials = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-")
    vocab = specials + chars + ["##" + c for c in chars] + syllables() + ["##" + s for s in syllables()]
    vocab += list(words(2)) + ["##" + w for w in words(2)]
    vocab += list(itertools.islice(words(3), shape["vocab_size"] - len(vocab)))
    assert len(vocab) == shape["vocab_size"], len(vocab)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True, model_max_length=512)
    tok.save_pretrained(str(path))
    torch.manual_seed(0)
    BertModel(BertConfig(**shape), add_pooling_layer=True).eval().save_pretrained(str(path))
    write_sentence_transformers(path, shape["hidden_size"], "cls", max_seq_length=512, lower_case=True)


def qwen_vocab_and_merges(size: int) -> tuple[dict, list]:
    """A byte-level BPE of `size` entries: the 256 byte symbols, then syllables and words of them,
    each entry with the merge that makes it (with and without the leading-space symbol "Ġ")."""
    from tokenizers import pre_tokenizers

    vocab = {s: i for i, s in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = []

    def add(left, right):
        if len(vocab) < size and left + right not in vocab:
            merges.append((left, right))
            vocab[left + right] = len(vocab)

    for c in CONSONANTS:
        add("Ġ", c)
    for s in syllables():
        add(s[0], s[1])
        add("Ġ" + s[0], s[1])
    for n in (2, 3, 4):  # longer words: the (n-1)-syllable word plus one syllable
        for w in words(n):
            add(w[:-2], w[-2:])
            add("Ġ" + w[:-2], w[-2:])
            if len(vocab) == size:
                return vocab, merges
    raise AssertionError("not enough words for the vocabulary")


def write_qwen3(path: Path, shape: dict) -> None:
    import torch
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    vocab, merges = qwen_vocab_and_merges(min(QWEN_BASE_VOCAB, shape["vocab_size"] - len(QWEN_ADDED)))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_ADDED])
    eot = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(  # Qwen3-Embedding's: EOS appended to every text
        single="$A:0 <|endoftext|>:0", pair="$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", eot)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   padding_side="left", model_max_length=32768)
    fast.save_pretrained(str(path))
    config_file = path / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "tokenizer_class": "Qwen2Tokenizer"},
                                      indent=2))
    torch.manual_seed(0)
    shape = {**shape, "bos_token_id": eot, "eos_token_id": eot}
    config = Qwen3Config(**shape, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    Qwen3ForCausalLM(config).to(torch.bfloat16).eval().save_pretrained(str(path))
    write_sentence_transformers(path, shape["hidden_size"], "lasttoken", max_seq_length=32768, lower_case=False)


def write_sentence_transformers(path: Path, dim: int, pooling: str, max_seq_length: int, lower_case: bool) -> None:
    """modules.json (Transformer, Pooling, Normalize), 1_Pooling/config.json and the other sentence-transformers
    files in the layout of the hub's bge and Qwen3-Embedding repositories."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
    pooling_config = {"word_embedding_dimension": dim,
                      **{f"pooling_mode_{m}": m.startswith(pooling) for m in modes}, "include_prompt": True}
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2))
    (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                "do_lower_case": lower_case}))
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}, indent=2))


def token_lengths(n: int, low: int, high: int, seed: int) -> list[int]:
    """n lengths in [low, high], log-uniform (as many texts of 8-16 tokens as of 256-512), seeded."""
    rng = random.Random(seed)
    return [min(high, int(math.exp(rng.uniform(math.log(low), math.log(high + 1))))) for _ in range(n)]


def make_texts(model_dir: Path, lengths: list[int], seed: int) -> list[str]:
    """One text per entry of `lengths`, which tokenizes (the model's tokenizer.json, special tokens
    included) to exactly that many tokens: lower-case words of 1-4 syllables, a full stop every few words.

    Raises AssertionError where a text's tokenized length differs from its target.
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    n_special = len(tok.encode("ba").ids) - len(tok.encode("ba", add_special_tokens=False).ids)
    rng, costs = random.Random(seed), {}

    def cost(piece):  # tokens of one word with its leading space (texts' pre-tokens are additive)
        if piece not in costs:
            costs[piece] = len(tok.encode(piece, add_special_tokens=False).ids)
        return costs[piece]

    syl = syllables()
    texts = []
    for target in lengths:
        pieces, used = [], n_special
        while used < target:
            word = "".join(rng.choice(syl) for _ in range(rng.choice((1, 2, 2, 3, 4))))
            word += "." if rng.random() < 0.1 else ""
            piece = word if not pieces else " " + word
            if used + cost(piece) > target:
                piece = (" " if pieces else "") + rng.choice(syl)  # one token in both vocabularies
            pieces.append(piece)
            used += cost(piece)
        texts.append("".join(pieces))
    got = [len(e.ids) for e in tok.encode_batch(texts)]
    bad = [(t, g) for t, g in zip(lengths, got) if t != g]
    assert not bad, f"texts off their target token lengths (target, got): {bad[:5]}"
    return texts
