"""Build a Hugging Face fast tokenizer from the metadata of a GGUF file.

A GGUF file carries no ``tokenizer.json``; llama.cpp stores the tokenizer as metadata instead:

* ``tokenizer.ggml.model``       -- the tokenizer family; only ``"gpt2"`` (byte-level BPE) is supported.
* ``tokenizer.ggml.pre``         -- how text is split before BPE (see ``_PRE_TOKENIZERS``).
* ``tokenizer.ggml.tokens``      -- list[str], one per id; ordinary tokens are spelled in the GPT-2
  byte alphabet ("Ġthe"), added tokens as plain text ("<|im_start|>").
* ``tokenizer.ggml.token_type``  -- int array, one per id (1 normal, 3 control, 4 user-defined, ...).
* ``tokenizer.ggml.merges``      -- list[str] of ``"left right"`` pairs, best first.
* ``tokenizer.ggml.{bos,eos,unknown,padding}_token_id``, ``tokenizer.ggml.add_{bos,eos}_token``.
* ``tokenizer.chat_template``    -- the Jinja chat template.

Only ``tokenizers`` and ``transformers.PreTrainedTokenizerFast`` are used, so this does not import
torch (``transformers.integrations.gguf`` does).
"""
import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
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
    "qwen2": _split_then_bytes(_QWEN2_SPLIT),
}
# Llama 3 vocabularies take a word found whole in the vocabulary as one token without merging
# (``ignore_merges``) and, when the file does not say, add BOS (llama.cpp's defaults).
_LLAMA3 = frozenset({"llama-bpe"})
_SUPPORTED_MODELS = ("gpt2",)


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


def load_gguf_tokenizer(file: GGUFFile) -> PreTrainedTokenizerFast:
    """A ``PreTrainedTokenizerFast`` equivalent to the tokenizer described by ``file``'s metadata.

    Raises ``ValueError`` for a ``tokenizer.ggml.model`` or ``tokenizer.ggml.pre`` not supported here.
    """
    meta = file.value

    model = meta("tokenizer.ggml.model")
    if model not in _SUPPORTED_MODELS:
        raise ValueError(
            f"Unsupported GGUF tokenizer.ggml.model {model!r}; supported: {list(_SUPPORTED_MODELS)}. "
            "Read the tokenizer from the model's Hugging Face directory instead: LLM(model, tokenizer=dir)."
        )
    pre = meta("tokenizer.ggml.pre")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(
            f"Unsupported GGUF tokenizer.ggml.pre {pre!r} for tokenizer.ggml.model {model!r}; "
            f"supported: {sorted(_PRE_TOKENIZERS)}."
        )

    tokens: list[str] = meta("tokenizer.ggml.tokens")
    token_types: np.ndarray = meta("tokenizer.ggml.token_type", np.zeros(0, np.int32))
    merges = [tuple(merge.split(" ", 1)) for merge in meta("tokenizer.ggml.merges", [])]

    backend = Tokenizer(
        models.BPE(
            vocab={token: i for i, token in enumerate(tokens)},
            merges=merges,
            ignore_merges=pre in _LLAMA3,
        )
    )
    backend.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    backend.decoder = decoders.ByteLevel()
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

    bos, eos = special("bos"), special("eos")
    add_bos = bool(meta("tokenizer.ggml.add_bos_token", pre in _LLAMA3)) and bos is not None
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
