"""Build a Hugging Face fast tokenizer from the metadata of a GGUF file.

A GGUF file carries no ``tokenizer.json``; llama.cpp stores the tokenizer as metadata instead:

* ``tokenizer.ggml.model``       -- the tokenizer family: ``"gpt2"`` (byte-level BPE: Llama 3, Qwen2/3,
  SmolLM) or ``"llama"`` (SentencePiece BPE with byte fallback: Llama 2, ERNIE-4.5).
* ``tokenizer.ggml.pre``         -- ``gpt2`` only: how text is split before BPE (see ``_PRE_TOKENIZERS``).
* ``tokenizer.ggml.tokens``      -- list[str], one per id. ``gpt2``: ordinary tokens spelled in the GPT-2
  byte alphabet ("Ġthe"), added tokens as plain text ("<|im_start|>"). ``llama``: SentencePiece pieces,
  spaces as "▁" ("▁the"), bytes as "<0x0A>".
* ``tokenizer.ggml.token_type``  -- int array, one per id (1 normal, 2 unknown, 3 control, 4 user-defined,
  5 unused, 6 byte).
* ``tokenizer.ggml.merges``      -- ``gpt2``: list[str] of ``"left right"`` pairs, best first.
* ``tokenizer.ggml.scores``      -- ``llama``: float array, one per id; BPE merges the adjacent pair whose
  joined piece scores highest (as llama.cpp's and SentencePiece's BPE do), so the merges are the
  vocabulary's splits ranked by the joined piece's score.
* ``tokenizer.ggml.add_space_prefix`` -- ``llama``: a "▁" before the text and after each added token, as
  llama.cpp tokenizes (default true).
* ``tokenizer.ggml.{bos,eos,unknown,padding}_token_id``, ``tokenizer.ggml.add_{bos,eos}_token``.
* ``tokenizer.chat_template``    -- the Jinja chat template.

Only ``tokenizers`` and ``transformers.PreTrainedTokenizerFast`` are used, so this does not import
torch (``transformers.integrations.gguf`` does).
"""
import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from fastdeploy.model_executor.model_loader.gguf_file import GGUFFile

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# Split regexes of the tokenizer.json files the llama.cpp ``pre`` names stand for.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_bytes() -> pre_tokenizers.PreTokenizer:
    """GPT-2's own split regex, then bytes to the byte alphabet."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    """Every digit on its own, then GPT-2's split (StarCoder, SmolLM)."""
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_bytes()])


def _split_then_bytes(pattern: str):
    """A model-specific split regex, then bytes to the byte alphabet."""
    return lambda: pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# ``tokenizer.ggml.pre`` -> builder of the matching pre-tokenizer (llama.cpp's llama-vocab.cpp).
_PRE_TOKENIZERS = {
    "gpt-2": _gpt2_bytes,
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
    "llama-bpe": _split_then_bytes(_LLAMA3_SPLIT),
    "llama3": _split_then_bytes(_LLAMA3_SPLIT),
    "llama-v3": _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": _split_then_bytes(_QWEN2_SPLIT),  # Qwen2, Qwen2.5, Qwen3
    "deepseek-r1-qwen": _split_then_bytes(_QWEN2_SPLIT),
}
# Llama 3 vocabularies take a word found whole in the vocabulary as one token without merging
# (``ignore_merges``) and, when the file does not say, add BOS (llama.cpp's defaults).
_LLAMA3 = frozenset({"llama-bpe", "llama3", "llama-v3"})
_SUPPORTED_MODELS = ("gpt2", "llama")


def _bos_eos_processor(backend: Tokenizer, bos: str | None, eos: str | None):
    """Post-processor writing ``bos`` / ``eos`` (None: nothing) around each text."""

    def wrap(sequence: str, type_id: int) -> str:
        pieces = [bos] * (bos is not None) + [sequence] + [eos] * (eos is not None)
        return " ".join(f"{piece}:{type_id}" for piece in pieces)

    return processors.TemplateProcessing(
        single=wrap("$A", 0),
        pair=f"{wrap('$A', 0)} {wrap('$B', 1)}",
        special_tokens=[(token, backend.token_to_id(token)) for token in (bos, eos) if token is not None],
    )


def _byte_level_backend(meta, tokens: list[str]) -> Tokenizer:
    """``gpt2``: BPE over the GPT-2 byte alphabet after the ``tokenizer.ggml.pre`` split."""
    pre = meta("tokenizer.ggml.pre")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(
            f"Unsupported GGUF tokenizer.ggml.pre {pre!r} for tokenizer.ggml.model 'gpt2'; "
            f"supported: {sorted(_PRE_TOKENIZERS)}."
        )
    merges = [tuple(merge.split(" ", 1)) for merge in meta("tokenizer.ggml.merges", [])]
    backend = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges,
                                   ignore_merges=pre in _LLAMA3))
    backend.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    backend.decoder = decoders.ByteLevel()
    return backend


def _score_ranked_merges(tokens: list[str], scores: np.ndarray, token_types: np.ndarray) -> list[tuple[str, str]]:
    """Every (left, right) split of a normal token into two vocabulary pieces, best joined score first
    (ties: by the pieces' ids)."""
    ids = {token: i for i, token in enumerate(tokens)}
    ranked = []
    for i, token in enumerate(tokens):
        if token_types.size and token_types[i] != 1:
            continue
        for cut in range(1, len(token)):
            left, right = ids.get(token[:cut]), ids.get(token[cut:])
            if left is not None and right is not None:
                ranked.append((-float(scores[i]), left, right))
    ranked.sort()
    return [(tokens[left], tokens[right]) for _, left, right in ranked]


def _sentencepiece_backend(meta, tokens: list[str], token_types: np.ndarray) -> Tokenizer:
    """``llama``: SentencePiece BPE: spaces as "▁" (and one before the text), pieces merged by score,
    characters outside the vocabulary as their UTF-8 bytes' <0xNN> tokens."""
    scores = meta("tokenizer.ggml.scores", np.zeros(len(tokens), np.float32))
    unknown = meta("tokenizer.ggml.unknown_token_id", 0)
    backend = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)},
                                   merges=_score_ranked_merges(tokens, scores, token_types),
                                   unk_token=tokens[unknown], fuse_unk=True, byte_fallback=True))
    prefix = bool(meta("tokenizer.ggml.add_space_prefix", True))
    # llama.cpp puts the "▁" before every run of text that starts the input or follows an added token
    # (a normalizer runs on each such run); tokenizers' Metaspace would not add one to " text"
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581")] * prefix
                                              + [normalizers.Replace(" ", "\u2581")])
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + [decoders.Strip(content=" ", left=1, right=0)] * prefix)
    return backend


def load_gguf_tokenizer(file: GGUFFile) -> PreTrainedTokenizerFast:
    """A ``PreTrainedTokenizerFast`` equivalent to the tokenizer described by ``file``'s metadata.

    Raises ``ValueError`` for a ``tokenizer.ggml.model`` or (``gpt2``) ``tokenizer.ggml.pre`` not
    supported here.
    """
    meta = file.value

    model = meta("tokenizer.ggml.model")
    if model not in _SUPPORTED_MODELS:
        raise ValueError(
            f"Unsupported GGUF tokenizer.ggml.model {model!r}; supported: {list(_SUPPORTED_MODELS)}. "
            "Read the tokenizer from the model's Hugging Face directory instead: LLM(model, tokenizer=dir)."
        )
    tokens: list[str] = meta("tokenizer.ggml.tokens")
    token_types: np.ndarray = meta("tokenizer.ggml.token_type", np.zeros(0, np.int32))
    if model == "gpt2":
        backend = _byte_level_backend(meta, tokens)
    else:
        backend = _sentencepiece_backend(meta, tokens, token_types)
    # Added tokens match whole in raw text and keep their ids (their strings are already in the vocab).
    backend.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False)
         for i in np.flatnonzero(token_types == TOKEN_TYPE_CONTROL)]
    )
    backend.add_tokens(
        [AddedToken(tokens[i], special=False, normalized=False)
         for i in np.flatnonzero(token_types == TOKEN_TYPE_USER_DEFINED)]
    )

    def special(name):
        """The token ``tokenizer.ggml.<name>_token_id`` names, or None."""
        token_id = meta(f"tokenizer.ggml.{name}_token_id")
        return None if token_id is None else tokens[token_id]

    # llama.cpp's defaults when the file does not say: BOS for Llama 3 and SentencePiece vocabularies
    bos, eos = special("bos"), special("eos")
    default_bos = model == "llama" or meta("tokenizer.ggml.pre") in _LLAMA3
    add_bos = bool(meta("tokenizer.ggml.add_bos_token", default_bos)) and bos is not None
    add_eos = bool(meta("tokenizer.ggml.add_eos_token", False)) and eos is not None
    backend.post_processor = _bos_eos_processor(backend, bos if add_bos else None, eos if add_eos else None)

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        unk_token=special("unknown"),
        pad_token=special("padding"),
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        chat_template=meta("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    )
