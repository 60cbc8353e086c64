"""The llguidance backend (the `guidance` and `auto` choices): grammars compiled by llguidance's
Earley parser and lexer over the model's vocabulary, token masks filled by its Rust executor.

llguidance (https://github.com/guidance-ai/llguidance) takes JSON schemas, regexes, Lark and GBNF
grammars; `compile` turns a GrammarSpec into a template matcher (the parser and lexer built once),
and each request gets a copy of it. Every call that builds or masks releases the GIL.
"""
from __future__ import annotations

import copy

import numpy as np

from fastdeploy.structured_output.backends import transformers_tokenizer
from fastdeploy.structured_output.grammar import STRUCTURAL_TAG_FORM, GrammarSpec, structural_tag_parts


class GuidanceBackend:
    """llguidance over one tokenizer.

    Args:
        tokenizer: the engine's transformers tokenizer (its Rust `tokenizers` backend is read).
        vocab_size: the model's vocabulary (logits width); ids the tokenizer lacks are never allowed.
        eos_token_ids: the ids allowed where the grammar is complete.
    """

    name = "guidance"

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids):
        import llguidance

        self._ll = llguidance
        self.tokenizer = _ll_tokenizer(llguidance, tokenizer, vocab_size, sorted(eos_token_ids))
        self.executor = llguidance.LLExecutor()

    def compile(self, spec: GrammarSpec):
        """A template matcher for `spec`; ValueError with llguidance's message when it does not compile."""
        grammar = self._grammar(spec)
        template = self._ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if template.is_error():
            raise ValueError(template.get_error())
        return template

    def _grammar(self, spec: GrammarSpec) -> str:
        ll = self._ll
        if spec.kind == "json":
            options = {"whitespace_flexible": False} if spec.whitespace == "" else {"whitespace_pattern": spec.whitespace}
            return ll.LLMatcher.grammar_from_json_schema(spec.source, overrides=options)
        if spec.kind == "structural_tag":
            return ll.StructTag.to_grammar(_struct_tags(ll, spec.source))
        try:
            return ll.grammar_from(spec.kind, spec.source)  # "regex", "choice", "grammar" (GBNF or Lark)
        except Exception as error:  # noqa: BLE001 - the GBNF converter raises bare Exceptions
            raise ValueError(str(error)) from None

    def matcher(self, compiled):
        """A fresh matcher of a compiled grammar, at its start."""
        return compiled.deep_copy()

    def accept_token(self, matcher, token_id: int) -> bool:
        """Advance by one sampled token; False when the grammar rejects it (the matcher is then in error)."""
        return matcher.consume_token(token_id)

    def rollback(self, matcher, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        matcher.rollback(num_tokens)

    def fill_bitmask(self, matchers: list, bitmask: np.ndarray) -> None:
        """Row i of bitmask [len(matchers), words] int32 (C-contiguous) := the allowed tokens of matchers[i]."""
        rows, words = bitmask.shape
        self.executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bitmask.ctypes.data,
                                              words * 4, rows)


def _ll_tokenizer(llguidance, tokenizer, vocab_size: int, eos_token_ids: list):
    """llguidance's tokenizer from the Rust `tokenizers` backend of a transformers tokenizer (or of
    the one a wrapper such as Ernie4_5Tokenizer holds)."""
    backend = getattr(transformers_tokenizer(tokenizer), "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"guided decoding needs a tokenizer with a `tokenizers` backend; {type(tokenizer).__name__} "
                         "has none")
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    return llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=eos_token_ids)


def _struct_tags(llguidance, source: str) -> list:
    """llguidance StructTags of a structural tag's JSON (grammar.py `structural_tag_parts`): each
    structure under the trigger its `begin` starts with."""
    structures, triggers = structural_tag_parts(source)
    tags = []
    try:
        for item in structures:
            trigger = next((t for t in triggers if item["begin"].startswith(t)), None)
            if trigger is None:
                raise ValueError(f"begin {item['begin']!r} starts with none of the triggers {triggers}")
            tags.append(llguidance.StructTag(trigger=trigger, begin=item["begin"], grammar=item["schema"],
                                             end=item["end"]))
    except (TypeError, AssertionError) as error:
        raise ValueError(f"{STRUCTURAL_TAG_FORM} ({type(error).__name__}: {error})") from None
    return tags
