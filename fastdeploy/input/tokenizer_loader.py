"""The tokenizer of a model directory, offline, through transformers' tokenizer layer, with its chat template.

`load_model_tokenizer(model_dir)` is what a Hugging Face layout or FastDeploy `-Paddle` directory
of the model zoo (Llama, Qwen2/Qwen3, ERNIE-4.5) is tokenized with. Nothing here downloads, and
no code shipped with a model is ever executed (`trust_remote_code=False` throughout).

Facts this module relies on (sources):

- ERNIE-4.5 tokenizer files. Baidu's first releases (e.g. the ModelScope copy of
  ERNIE-4.5-0.3B-Base kept in github.com/Hchnr/early_exiting, `ERNIE45_03B_Base/`) ship a
  sentencepiece `tokenizer.model` and a `tokenizer_config.json` with `"tokenizer_class":
  "Ernie4_5_Tokenizer"`, `"auto_map": {"AutoTokenizer": ["tokenization_ernie4_5.Ernie4_5_Tokenizer",
  null]}` (remote code), bos `<s>`, eos `</s>`, pad/unk `<unk>`, cls `<|begin_of_sentence|>`, sep
  `<|end_of_sentence|>`, mask `<mask:1>`, and ERNIE's own named tokens `sys_start_token` `<mask:4>`,
  `sys_end_token` `<mask:5>`, `header_start_token` `<mask:6>`, `header_end_token` `<mask:7>`, plus an
  inline `chat_template` (`<|begin_of_sentence|>`, "User: ...\\n", "Assistant: ...<|end_of_sentence|>").
  Later repos (PaddleFormers/FastDeploy `Ernie4_5Tokenizer`; the `-PT` repos converted for
  transformers) add `tokenizer.json`, `special_tokens_map.json`, `chat_template.jinja`; e.g.
  baidu/ERNIE-4.5-21B-A3B-Thinking lists chat_template.jinja, special_tokens_map.json,
  tokenizer.json, tokenizer.model and tokenizer_config.json (its Hub model.json, kept in
  github.com/daniel-p-green/alain-ai-learning-platform).
- ERNIE's reference tokenizer (FastDeploy `fastdeploy/input/ernie4_5_tokenizer.py`, the same in
  PaddleFormers and in the repos' remote `tokenization_ernie4_5.py`): text is split on the added and
  special tokens, each remaining piece is `sp_model.encode_as_pieces(piece)`; `add_special_tokens`
  is ignored (no BOS is ever added); decoding joins runs of pieces with `sp_model.decode` and
  special tokens verbatim, with `clean_up_tokenization_spaces=False` and
  `spaces_between_special_tokens=False`. transformers' ERNIE port (huggingface/transformers
  `models/ernie4_5/convert_ernie4_5_tokenizer.py`) converted the same `tokenizer.model` with
  LlamaTokenizer `legacy=True, add_prefix_space=False, add_bos_token=False`: a normalizer that only
  escapes spaces as "▁", no dummy prefix, byte fallback, no leading-space strip on decode.
- transformers 5.23 (`models/auto/tokenization_auto.py`): "ernie4_5" and "ernie4_5_moe" are in
  `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`, so with a config.json of those model types AutoTokenizer
  ignores the `auto_map` (unless `trust_remote_code=True`) and the unknown class name, and loads
  `TokenizersBackend`. With a `tokenizer.json` that file is used as is. With only `tokenizer.model`,
  `TokenizersBackend._convert_from_sentencepiece` builds a generic tokenizer
  (`SpmConverter.build_tokenizer_from_spm_proto`): the model and byte fallback are right, but it
  ignores the proto's `add_dummy_prefix` and `remove_extra_whitespaces` and registers neither the
  control nor the user-defined pieces as tokens, so e.g. a user-defined `<mask:2>` or `<|im_start|>`
  in a prompt is spelled out piece by piece where sentencepiece (and ERNIE's tokenizer) give one id.
  For any other model type an `auto_map` makes AutoTokenizer refuse (remote code) and an unknown
  `tokenizer_class` has no class to load.

Decisions:

1. A directory whose tokenizer is sentencepiece only (a `tokenizer.model`, or FastDeploy's other
   names `spm.model` / `ernie_token_100k.model`, and no `tokenizer.json`) and whose declared class
   transformers cannot provide (an `auto_map`, or a `tokenizer_class` transformers does not know,
   e.g. `Ernie4_5Tokenizer` / `Ernie4_5_Tokenizer`) is built by `load_sentencepiece_tokenizer`.
2. Everything else goes to `AutoTokenizer.from_pretrained(dir, trust_remote_code=False,
   local_files_only=True)`. If that fails (e.g. an `auto_map` with a model type transformers does not
   override, or no config.json), the error is logged and the directory is read by transformers'
   `TokenizersBackend.from_pretrained` when it has a `tokenizer.json` (what AutoTokenizer itself does
   for ERNIE), else built by `load_sentencepiece_tokenizer` when it has a sentencepiece model;
   otherwise the error propagates.
   If AutoTokenizer succeeded on a sentencepiece-only directory with its generic conversion (the
   result is a plain `TokenizersBackend`, as for an ERNIE config.json), that result is replaced by
   `load_sentencepiece_tokenizer`'s, which follows the proto. Model-specific classes that transformers
   converts itself (LlamaTokenizer, T5, Gemma ...) and every `tokenizer.json` are left to transformers.
3. `load_sentencepiece_tokenizer` is transformers' own `TokenizersBackend.from_pretrained` (so
   tokenizer_config.json, special_tokens_map.json, added_tokens.json and chat_template.jinja are read
   by transformers, ERNIE's extra named tokens included), with one step replaced: the backend
   `tokenizers.Tokenizer` is built from the sentencepiece proto (read with transformers'
   `import_protobuf` schema, so only protobuf is needed at run time, not the sentencepiece
   package) so that it encodes like `SentencePieceProcessor.encode`: the proto's
   model (BPE with merges ranked by piece score over normal pieces, or Unigram), byte fallback,
   precompiled normalization, `remove_extra_whitespaces`, space escaping, `add_dummy_prefix`; control
   pieces become special tokens and user-defined pieces added tokens (transformers' `SpmConverter`
   rule), special when the tokenizer config names them as special tokens; `added_tokens_decoder`
   entries keep their ids (placeholders renamed, gaps past the vocabulary filled with
   `<|reserved_token_N|>`, as transformers does). Decoding: "▁" -> " ", byte fallback, fuse, and
   one leading space stripped only when the model adds a dummy prefix. No BOS/EOS is added unless
   the tokenizer config sets `add_bos_token` / `add_eos_token`; `clean_up_tokenization_spaces`
   defaults to False. The `auto_map` is dropped from the result, so saving it never points at
   remote code.
   As in transformers and in ERNIE's reference tokenizer, text is split at added/special tokens
   first and each run is encoded on its own. This only matters for models with `add_dummy_prefix`
   (ERNIE's has none, per transformers' conversion): each run gets its own dummy prefix, as the
   slow remote tokenizers give it for the tokens they register (sentencepiece alone would not
   prefix the run after a user-defined piece), while decoding strips only the first leading space.
4. The chat template is transformers' (tokenizer_config.json's `chat_template`, overridden by a
   `chat_template.jinja`); if the tokenizer still has none and `chat_template.jinja` exists, it is
   read from there.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

logger = logging.getLogger(__name__)

# FastDeploy's ERNIE loader tries these sentencepiece file names in this order (ernie4_5_processor).
SENTENCEPIECE_FILES = ("tokenizer.model", "spm.model", "ernie_token_100k.model")
TOKENIZER_JSON = "tokenizer.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"

# sentencepiece_model.proto: ModelProto.SentencePiece.Type and TrainerSpec.ModelType
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_UNIGRAM, _BPE = 1, 2


def load_model_tokenizer(model_dir: Path):
    """The model directory's tokenizer (a transformers tokenizer) with its chat template; see the module doc."""
    model_dir = Path(model_dir)
    spm_file = sentencepiece_file(model_dir)
    sentencepiece_only = spm_file is not None and not (model_dir / TOKENIZER_JSON).is_file()
    if sentencepiece_only and _declared_class_unavailable(model_dir):
        tokenizer = load_sentencepiece_tokenizer(model_dir, spm_file)
    else:
        tokenizer = _auto_tokenizer(model_dir, spm_file if sentencepiece_only else None)
    _attach_chat_template(tokenizer, model_dir)
    return tokenizer


def sentencepiece_file(model_dir: Path) -> Optional[Path]:
    """The directory's sentencepiece model file, or None."""
    for name in SENTENCEPIECE_FILES:
        if (Path(model_dir) / name).is_file():
            return Path(model_dir) / name
    return None


def load_sentencepiece_tokenizer(model_dir: Path, spm_file: Optional[Path] = None):
    """transformers' TokenizersBackend for a sentencepiece-only directory, built from the proto (decision 3)."""
    model_dir = Path(model_dir)
    spm_file = spm_file or sentencepiece_file(model_dir)
    if spm_file is None:
        raise FileNotFoundError(f"{model_dir} has no sentencepiece model (looked for {', '.join(SENTENCEPIECE_FILES)})")
    tokenizer = _sentencepiece_backend_class().from_pretrained(
        str(model_dir), vocab_file=str(spm_file), local_files_only=True, trust_remote_code=False
    )
    tokenizer.init_kwargs.pop("auto_map", None)
    return tokenizer


# ---- AutoTokenizer ---------------------------------------------------------------------------
def _auto_tokenizer(model_dir: Path, spm_file: Optional[Path]):
    """AutoTokenizer without remote code; `spm_file` set: sentencepiece-only dir, built by us if transformers cannot."""
    from transformers import AutoTokenizer, TokenizersBackend

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False, local_files_only=True)
    except Exception as error:  # noqa: BLE001 - any failure: fall back only where transformers' classes can
        if (model_dir / TOKENIZER_JSON).is_file():
            logger.info("AutoTokenizer could not load %s (%s: %s); reading its %s with TokenizersBackend",
                        model_dir, type(error).__name__, error, TOKENIZER_JSON)
            tokenizer = TokenizersBackend.from_pretrained(str(model_dir), local_files_only=True,
                                                          trust_remote_code=False)
            tokenizer.init_kwargs.pop("auto_map", None)
            return tokenizer
        if spm_file is None:
            raise
        logger.info("AutoTokenizer could not load %s (%s: %s); building it from %s",
                    model_dir, type(error).__name__, error, spm_file.name)
        return load_sentencepiece_tokenizer(model_dir, spm_file)
    if spm_file is not None and type(tokenizer) is TokenizersBackend:
        # transformers' generic sentencepiece conversion (no model-specific class): see the module doc
        return load_sentencepiece_tokenizer(model_dir, spm_file)
    return tokenizer


def _declared_class_unavailable(model_dir: Path) -> bool:
    """True if tokenizer_config.json asks for remote code or names a class transformers does not have."""
    config = _read_json(model_dir / "tokenizer_config.json")
    if config.get("auto_map"):
        return True
    name = config.get("tokenizer_class")
    if not name:
        return False
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    try:
        return tokenizer_class_from_name(name) is None
    except Exception:  # noqa: BLE001 - a name that cannot even be looked up is not available
        return True


def _attach_chat_template(tokenizer, model_dir: Path) -> None:
    jinja = model_dir / CHAT_TEMPLATE_FILE
    if getattr(tokenizer, "chat_template", None) is None and jinja.is_file():
        tokenizer.chat_template = jinja.read_text(encoding="utf-8")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    return data if isinstance(data, dict) else {}


# ---- sentencepiece proto -> tokenizers.Tokenizer ----------------------------------------------
_BACKEND_CLASS = None


def _sentencepiece_backend_class():
    """A TokenizersBackend whose only change is how the backend is built from the sentencepiece file."""
    global _BACKEND_CLASS
    if _BACKEND_CLASS is None:
        from transformers import TokenizersBackend

        class SentencePieceModelTokenizer(TokenizersBackend):
            """transformers' TokenizersBackend over a backend built from a sentencepiece proto (tokenizer_loader)."""

            vocab_files_names = {"vocab_file": SENTENCEPIECE_FILES[0]}

            @classmethod
            def convert_to_native_format(cls, trust_remote_code=False, **kwargs):
                kwargs = dict(kwargs)
                kwargs.pop("tokenizer_file", None)
                vocab_file = kwargs.get("vocab_file")
                if not vocab_file or not Path(vocab_file).is_file():
                    raise FileNotFoundError(f"sentencepiece model not found: {vocab_file}")
                kwargs["tokenizer_object"] = sentencepiece_to_tokenizers(
                    vocab_file, _special_token_strings(kwargs), kwargs.get("added_tokens_decoder") or {}
                )
                kwargs.setdefault("clean_up_tokenization_spaces", False)
                return kwargs

        SentencePieceModelTokenizer.__qualname__ = SentencePieceModelTokenizer.__name__
        _BACKEND_CLASS = SentencePieceModelTokenizer
    return _BACKEND_CLASS


def _special_token_strings(init_kwargs: dict) -> set[str]:
    """Every token the tokenizer config names as special (named, ERNIE's extra *_token keys, extras, added)."""
    from transformers import TokenizersBackend

    found: set[str] = set()

    def collect(value: Any) -> None:
        if value is None:
            return
        if isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)
        else:
            found.add(str(value))

    for key in TokenizersBackend.SPECIAL_TOKENS_ATTRIBUTES:
        collect(init_kwargs.get(key))
    for key in ("extra_special_tokens", "additional_special_tokens", "model_specific_special_tokens"):
        collect(init_kwargs.get(key))
    for token in (init_kwargs.get("added_tokens_decoder") or {}).values():
        if getattr(token, "special", False):
            found.add(str(token))
    return found


def sentencepiece_to_tokenizers(spm_path, special_tokens: set[str] = frozenset(), added_tokens_decoder: dict = None):
    """A `tokenizers.Tokenizer` that encodes like `SentencePieceProcessor(spm_path).encode` (decision 3).

    special_tokens: piece strings to register as special (besides control pieces).
    added_tokens_decoder: {id: transformers AddedToken} from the tokenizer config; their ids are kept.
    """
    from tokenizers import AddedToken as BackendAddedToken
    from tokenizers import Regex, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE, Unigram
    from transformers.convert_slow_tokenizer import import_protobuf
    from transformers.tokenization_utils_base import generate_merges

    try:
        schema = import_protobuf()  # sentencepiece's schema (from sentencepiece, else transformers')
    except ImportError as e:
        raise ImportError(f"reading the sentencepiece model {spm_path} (ERNIE-4.5 and other sentencepiece-only "
                          "tokenizers) needs protobuf or sentencepiece: pip install \"fastdeploy[ernie]\"") from e
    proto = schema.ModelProto()
    with open(spm_path, "rb") as f:
        proto.ParseFromString(f.read())
    trainer, norm = proto.trainer_spec, proto.normalizer_spec
    if trainer.treat_whitespace_as_suffix:
        raise ValueError(f"{spm_path}: sentencepiece models with treat_whitespace_as_suffix are not supported")
    pieces = [[p.piece, p.score, p.type] for p in proto.pieces]
    added_tokens_decoder = {int(i): t for i, t in (added_tokens_decoder or {}).items()}

    # added_tokens_decoder names a token at an id the model gives another piece: rename the placeholder
    present = {piece for piece, _, _ in pieces}
    for index, token in sorted(added_tokens_decoder.items()):
        content = str(token)
        if index < len(pieces) and pieces[index][0] != content and content not in present:
            present.discard(pieces[index][0])
            pieces[index][0] = content
            pieces[index][2] = _USER_DEFINED
            present.add(content)

    if trainer.model_type == _BPE:
        vocab = {piece: i for i, (piece, _, _) in enumerate(pieces)}
        normal = {piece: score for piece, score, kind in pieces if kind == _NORMAL}
        normal_ids = {piece: vocab[piece] for piece in normal}
        merges = generate_merges(normal_ids, vocab_scores=normal)  # best-scoring piece merges first
        unk = trainer.unk_piece if trainer.unk_piece in vocab else None
        model = BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True,
                    byte_fallback=trainer.byte_fallback, dropout=None)
    elif trainer.model_type == _UNIGRAM:
        normal_scores = [score for _, score, kind in pieces if kind == _NORMAL] or [0.0]
        floor = min(normal_scores) - 10.0  # pieces sentencepiece never emits from text stay out of the way
        vocab = [(piece, score if kind in (_NORMAL, _USER_DEFINED, _UNKNOWN) else floor)
                 for piece, score, kind in pieces]
        model = Unigram(vocab, unk_id=trainer.unk_id if trainer.unk_id >= 0 else None,
                        byte_fallback=trainer.byte_fallback)
    else:
        raise ValueError(f"{spm_path}: sentencepiece model_type {trainer.model_type} is not supported "
                         "(only unigram and BPE)")
    tokenizer = Tokenizer(model)

    steps = []
    if norm.precompiled_charsmap:
        steps.append(normalizers.Precompiled(norm.precompiled_charsmap))
    if norm.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if norm.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    if norm.add_dummy_prefix:
        steps.append(normalizers.Prepend("▁"))
    if steps:
        tokenizer.normalizer = normalizers.Sequence(steps)
    chain = [decoders.Replace("▁", " ")]
    if trainer.byte_fallback:
        chain.append(decoders.ByteFallback())
    chain.append(decoders.Fuse())
    if norm.add_dummy_prefix:
        chain.append(decoders.Strip(content=" ", left=1, right=0))
    tokenizer.decoder = decoders.Sequence(chain)

    # control pieces are special, user-defined pieces are plain added tokens unless the config says special
    added = []
    for piece, _, kind in pieces:
        if kind in (_CONTROL, _USER_DEFINED):
            added.append(BackendAddedToken(piece, normalized=False,
                                           special=kind == _CONTROL or piece in special_tokens))
    # tokens of the config past the model's pieces, in id order (gaps get placeholders)
    for index in range(len(pieces), max(added_tokens_decoder, default=-1) + 1):
        token = added_tokens_decoder.get(index)
        if token is None:
            added.append(BackendAddedToken(f"<|reserved_token_{index}|>", normalized=False, special=True))
        else:
            added.append(BackendAddedToken(
                str(token), single_word=getattr(token, "single_word", False),
                lstrip=getattr(token, "lstrip", False), rstrip=getattr(token, "rstrip", False),
                normalized=getattr(token, "normalized", False),
                special=bool(getattr(token, "special", False)) or str(token) in special_tokens,
            ))
    tokenizer.add_tokens(added)  # in order: tokens new to the vocabulary take the next ids
    for index, token in added_tokens_decoder.items():
        got = tokenizer.token_to_id(str(token))
        if got != index:
            raise ValueError(f"{spm_path}: added token {str(token)!r} is declared at id {index} "
                             f"but the sentencepiece vocabulary puts it at {got}")
    return tokenizer
