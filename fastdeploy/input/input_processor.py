"""Input processor: a prompt (text and/or token ids) + SamplingParams -> a validated `PreparedPrompt`.

Everything that can be checked before a request is queued is checked here, so bad input raises
(ValueError/TypeError naming the field and the allowed values) before any work starts:
the prompt (text that is valid Unicode, non-empty, ids inside the vocabulary, room to generate within
max_model_len, enough KV blocks for it), and the sampling parameters against the model (vocabulary,
max_logprobs, the logits processors' arguments). The caller's SamplingParams is never modified: the
prompt gets a resolved copy with the model's generation_config defaults filled in and max_tokens
clamped to the context left.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from fastdeploy.config import FDConfig
from fastdeploy.engine.pooling_params import PoolingParams
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.input.bad_words import bad_words_token_ids
from fastdeploy.model_executor.logits_processor import load_class


@dataclass
class PreparedPrompt:
    """One validated prompt, ready to become its `n` requests.

    Attributes:
        prompt: the prompt text (None for token input).
        prompt_token_ids: [num_prompt_tokens] ids.
        positions: [num_prompt_tokens] int64 (text: 0..n-1; [3, n] for M-RoPE models).
        sampling_params: the resolved copy (see module docstring).
        bad_words_token_ids: banned token-id sequences from bad_words and bad_words_token_ids.
        token_type_ids: [num_prompt_tokens] int64 modality per token (0 text, 1 image, 2 video), or
            None for a text model.
        mm_features: the prompt's images/videos (multimodal/inputs.py), in prompt order.
        pooling_params: a pooling model's prompt: its resolved PoolingParams (sampling_params is then
            None, and token_type_ids an encoder's segment ids: 0 for the first text, 1 for the second).
    """

    prompt: Optional[str]
    prompt_token_ids: list[int]
    positions: np.ndarray
    sampling_params: Optional[SamplingParams]
    bad_words_token_ids: list
    token_type_ids: Optional[np.ndarray] = None
    mm_features: list = field(default_factory=list)
    pooling_params: Optional[PoolingParams] = None

    def num_placeholder_tokens(self, modality: str) -> int:
        """Prompt tokens standing for the prompt's images (or videos): FastDeploy's num_input_image_tokens."""
        return sum(f.length for f in self.mm_features if f.modality == modality)


def check_text(text: str, where: str) -> None:
    """Raise ValueError when `text` holds a surrogate code point (U+D800-U+DFFF; in a Python str, a lone
    surrogate, e.g. from JSON's "\\ud800" or bytes decoded with errors="surrogateescape"): it is not a
    Unicode character, so no tokenizer can encode it (the tokenizers library raises a bare TypeError).
    `where` names the text in the message ("prompt 2")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where} holds the lone surrogate U+{ord(text[e.start]):04X} at character {e.start}, "
                         "which is not valid Unicode text and cannot be tokenized") from None


def eos_token_ids(tokenizer, generation_config: dict) -> frozenset:
    """EOS ids: generation_config.json's eos_token_id (int or list) plus the tokenizer's."""
    ids = generation_config.get("eos_token_id")
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


class InputProcessor:
    """The input processor of text models (vl_processor.VLInputProcessor extends it)."""

    accepts_multimodal = False  # whether prompts may carry images/videos

    def __init__(self, fd_config: FDConfig, tokenizer):
        self.config = fd_config
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids(tokenizer, fd_config.generation_config)
        self.num_usable_blocks = fd_config.cache_config.num_blocks - 1  # block 0 is the null block
        self.logits_processor_classes = [load_class(spec) for spec in fd_config.logits_processors]

    def process(self, prompt: Optional[str], prompt_token_ids: Optional[list[int]], params: SamplingParams,
                index: Optional[int] = None, mm_data=None) -> PreparedPrompt:
        """Validate one prompt and resolve its parameters; `index` names the prompt in errors.
        prompt_token_ids None: the prompt text is tokenized without special tokens (FastDeploy's rule).
        `mm_data` (images/videos) is a ValueError here: this model takes text only."""
        if mm_data is not None:
            raise ValueError(f"prompt {index}: images/videos were given, but {self.config.model_config.architecture} "
                             "is a text model")
        if prompt_token_ids is None:
            check_text(prompt, "prompt" if index is None else f"prompt {index}")
            prompt_token_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        self.validate_prompt(prompt_token_ids, index)
        resolved = self.resolve_sampling_params(params, len(prompt_token_ids))  # rejects greedy n > 1 too
        self.check_logits_processing(resolved, index)
        banned = bad_words_token_ids(self.tokenizer, resolved.bad_words or [], resolved.bad_words_token_ids or [],
                                     self.config.model_config.vocab_size)
        positions = np.arange(len(prompt_token_ids), dtype=np.int64)  # text: 1-D, one per token
        return PreparedPrompt(prompt, list(prompt_token_ids), positions, resolved, banned)

    def process_pooling(self, prompt: Optional[str], prompt_token_ids: Optional[list[int]], params: PoolingParams,
                        index: Optional[int] = None, text_pair: Optional[str] = None) -> PreparedPrompt:
        """Validate one prompt of a pooling model (params already for its task: PoolingParams.for_task).

        Text is tokenized WITH the tokenizer's special tokens, as sentence-transformers does ([CLS] ... [SEP]
        for BERT, the EOS Qwen3-Embedding's tokenizer appends); `text_pair` makes the cross-encoder input
        `[CLS] a [SEP] b [SEP]` with segment ids 0/1 (the tokenizer's pair template). Token ids are taken as
        given. `params.truncate_prompt_tokens` = k keeps k tokens (-1: max_model_len), cut on the
        tokenizer's truncation side with its special tokens kept; otherwise a prompt longer than
        max_model_len is a ValueError naming it."""
        where = "prompt" if index is None else f"prompt {index}"
        max_len = self.config.scheduler_config.max_model_len
        k = params.truncate_prompt_tokens
        k = max_len if k == -1 else k
        if k is not None and k > max_len:
            raise ValueError(f"{where}: truncate_prompt_tokens={k} exceeds max_model_len={max_len}")
        token_types = None
        if prompt_token_ids is None:
            for text in (prompt, text_pair):
                if text is not None:
                    check_text(text, where)
            encoded = self.tokenizer(prompt, text_pair, add_special_tokens=True, truncation=k is not None,
                                     max_length=k, return_token_type_ids=True)
            prompt_token_ids = list(encoded["input_ids"])
            token_types = encoded.get("token_type_ids")
        elif k is not None and len(prompt_token_ids) > k:
            side = getattr(self.tokenizer, "truncation_side", "right")
            prompt_token_ids = prompt_token_ids[:k] if side == "right" else prompt_token_ids[-k:]
        if len(prompt_token_ids) > max_len:
            raise ValueError(f"{where} has {len(prompt_token_ids)} tokens, above max_model_len={max_len}: shorten it, "
                             "raise max_model_len, or set PoolingParams(truncate_prompt_tokens=...)")
        self.validate_prompt(prompt_token_ids, index, room_to_generate=False)
        resolved = params.resolve(self.config.pooler_config, self.config.model_config.hidden_size)
        segments = self.config.model_config.hf_config.get("type_vocab_size", 0) > 1  # BERT-style segment ids
        types = np.asarray(token_types, dtype=np.int64) if segments and token_types is not None else None
        positions = np.arange(len(prompt_token_ids), dtype=np.int64)
        return PreparedPrompt(prompt, list(prompt_token_ids), positions, None, [], token_type_ids=types,
                              pooling_params=resolved)

    def validate_prompt(self, prompt_token_ids: list[int], index: Optional[int] = None,
                        room_to_generate: bool = True) -> None:
        """Raise ValueError for an empty prompt, an id outside the vocabulary or a prompt too long (one that
        leaves no room to generate, unless `room_to_generate` is False)."""
        where = "" if index is None else f" (prompt {index})"
        max_len = self.config.scheduler_config.max_model_len
        vocab = self.config.model_config.vocab_size
        if len(prompt_token_ids) == 0:
            raise ValueError(f"prompt is empty{where}: at least one token is needed")
        if room_to_generate and len(prompt_token_ids) >= max_len:
            raise ValueError(
                f"prompt has {len(prompt_token_ids)} tokens{where}, but max_model_len={max_len} leaves no "
                "room to generate: shorten the prompt or raise max_model_len"
            )
        bad = [t for t in prompt_token_ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]!r}{where} is outside the vocabulary [0, {vocab})")
        blocks = -(-len(prompt_token_ids) // self.config.cache_config.block_size)
        if blocks > self.num_usable_blocks:
            raise ValueError(
                f"prompt{where} needs {blocks} KV blocks, the pool has {self.num_usable_blocks}: "
                "raise num_gpu_blocks_override or gpu_memory_utilization"
            )

    def resolve_sampling_params(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        """A copy with the model's defaults filled in, max_tokens clamped to the context, and the
        checks that need the model (vocabulary, max_logprobs). Raises ValueError naming the field."""
        params = params.clone()  # checked again: its fields may have been edited after construction
        gen = self.config.generation_config
        room = self.config.scheduler_config.max_model_len - prompt_len
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)

        def pick(name, neutral):
            value = getattr(params, name)
            return value if value is not None else gen.get(name, neutral)

        resolved = params.clone(
            max_tokens=max_tokens,
            min_tokens=min(params.min_tokens, max_tokens),
            temperature=float(pick("temperature", 1.0)),
            top_p=float(pick("top_p", 1.0)),
            top_k=max(int(pick("top_k", 0)), 0),
            repetition_penalty=float(pick("repetition_penalty", 1.0)),
            presence_penalty=float(pick("presence_penalty", 0.0)),
            frequency_penalty=float(pick("frequency_penalty", 0.0)),
        )
        self._check_against_model(resolved)
        return resolved

    def check_logits_processing(self, params: SamplingParams, index: Optional[int] = None) -> None:
        """logit_bias and allowed_token_ids inside the vocabulary, and `logits_processors_args` accepted
        by each of the LLM's logits processors (their `validate_params`). ValueError / TypeError
        naming the field and prompt `index`."""
        where = "" if index is None else f"prompt {index}: "
        vocab = self.config.model_config.vocab_size
        for name in ("logit_bias", "allowed_token_ids"):
            bad = [t for t in getattr(params, name) or () if t >= vocab]
            if bad:
                raise ValueError(f"{where}{name} holds token id {bad[0]}, outside the vocabulary [0, {vocab})")
        if params.logits_processors_args and not self.logits_processor_classes:
            raise ValueError(f"{where}logits_processors_args was given, but this LLM has no logits processors to "
                             "read it: build the LLM with logits_processors=[...], e.g. [\"LogitBiasLogitsProcessor\"]")
        for cls in self.logits_processor_classes:
            validate = getattr(cls, "validate_params", None)
            try:
                if validate is not None:
                    validate(params, self.config)
            except (ValueError, TypeError) as error:
                raise (TypeError if isinstance(error, TypeError) else ValueError)(f"{where}{error}") from error

    def _check_against_model(self, params: SamplingParams) -> None:
        vocab = self.config.model_config.vocab_size
        for name in ("stop_token_ids", "bad_words_token_ids"):
            bad = [t for t in getattr(params, name) or () if t >= vocab]
            if bad:
                raise ValueError(f"{name} holds {bad[0]}, outside the vocabulary [0, {vocab})")
        limit = self.config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is None:
                continue
            if limit is None:
                raise ValueError(f"{name}={k} was requested, but the LLM was made with enable_logprob=False")
            asked, allowed = (vocab if k == -1 else k), (vocab if limit == -1 else limit)
            if asked > allowed:
                raise ValueError(f"{name}={k} exceeds max_logprobs={limit}: ask for at most {limit} "
                                 "or raise LLM(max_logprobs=...) (-1 = the whole vocabulary)")
