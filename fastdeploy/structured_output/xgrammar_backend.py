"""The xgrammar backend (`LLM(guided_decoding_backend="xgrammar")`, the optional `fastdeploy[xgrammar]`
extra; xgrammar needs torch).

xgrammar (https://github.com/mlc-ai/xgrammar, 0.2.x) compiles a grammar against the vocabulary into
per-state token masks (a pushdown automaton with precomputed token sets); a request's
`GrammarMatcher` walks it. Its compile and mask calls run in C++ without the GIL.

How each GrammarSpec kind is compiled:
- json: `compile_json_schema` with `strict_mode=False`, so the schema's own `additionalProperties`
  rules hold, as with llguidance (xgrammar's strict mode would forbid properties the schema leaves
  open, and would make `json_object` accept only `{}`). Whitespace between JSON tokens:
  - "" (disable_any_whitespace): `any_whitespace=False` with separators "," and ":" (`{"a":1}`).
    xgrammar 0.2 keeps ", " between the items of values the schema leaves free (an object with no
    `properties`, an `items`-less array), so `json_object` output may have a space there.
  - the default bounded pattern: `any_whitespace=True` with `max_whitespace_cnt=21`: any run of up
    to 21 of space, tab, CR and LF on each side of every `,` `:` and bracket. llguidance's pattern
    allows, per gap, one space, or one newline and up to 20 spaces; this one admits all of those
    (newline plus 20 spaces is 21) and also tabs, CRs and several newlines, and spaces on both
    sides of a separator.
  - any other `whitespace_pattern`: ValueError (xgrammar takes no whitespace regex).
- regex: `compile_regex` (xgrammar's regex reader).
- choice: the EBNF alternation `root ::= "a" | "b"` of the JSON-escaped literals.
- grammar: GBNF (`root ::= ...`, FastDeploy's documented syntax) is xgrammar's own EBNF; a Lark
  grammar (a line starting `start:`, or `%llguidance`, the rule llguidance uses to tell them apart)
  goes to xgrammar's Lark reader; what it lacks of llguidance's Lark dialect (e.g. `%llguidance`)
  is a ValueError with xgrammar's message.
- structural_tag: `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}` as xgrammar's
  triggered tags (free text until a trigger; then the structure whose `begin` it starts).

Masks: where a grammar forces a text of several characters, xgrammar allows every token the text
starts with, llguidance only the one token it tokenizes the text with; elsewhere the two agree bit for
bit (tests/structured_output/test_xgrammar_backend.py).

Every xgrammar error (RuntimeError, pydantic's ValidationError, TypeError) becomes a ValueError with
xgrammar's message, less its C++ source locations and assertion text.
"""
from __future__ import annotations

import json
import re

import numpy as np

from fastdeploy.structured_output.backends import transformers_tokenizer
from fastdeploy.structured_output.grammar import WHITESPACE_BOUNDED, GrammarSpec, structural_tag_parts

MAX_WHITESPACE = 21  # the longest gap WHITESPACE_BOUNDED allows: a newline and 20 spaces
CACHE_LIMIT_BYTES = 512 << 20  # xgrammar's own compiled-grammar cache, behind the manager's LRU
_LARK = re.compile(r"(?m)^\s*(%llguidance\b|start\s*:)")
# C++ detail in xgrammar's messages: "[13:21:59] /project/cpp/x.cc:83: ", "Check failed: (cond) is false: "
_CPP_DETAIL = re.compile(r"\[[0-9:.]+\] \S+\.(?:cc|h):\d+: |Check failed: .*? is false: ")


class XGrammarBackend:
    """xgrammar over one tokenizer.

    Args:
        tokenizer: the engine's transformers tokenizer (or a wrapper holding one as `.tokenizer`,
            such as Ernie4_5Tokenizer).
        vocab_size: the model's vocabulary (logits width); ids the tokenizer lacks are never allowed.
        eos_token_ids: the ids allowed where the grammar is complete (xgrammar's stop tokens).

    Raises:
        ImportError: xgrammar (or torch) is not installed, naming the extra (backends.py).
    """

    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids):
        from fastdeploy.structured_output.backends import import_xgrammar

        xgr = import_xgrammar()
        import torch

        self._xgr = xgr
        self._torch = torch
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            _hf_tokenizer(tokenizer), vocab_size=vocab_size, stop_token_ids=sorted(eos_token_ids))
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, cache_enabled=True,
                                            cache_limit_bytes=CACHE_LIMIT_BYTES)
        self.batch = xgr.BatchGrammarMatcher()

    def compile(self, spec: GrammarSpec):
        """xgrammar's CompiledGrammar of `spec`; ValueError with xgrammar's message when it does not compile."""
        try:
            return self._compile(spec)
        except (RuntimeError, ValueError, TypeError) as error:
            raise ValueError(_CPP_DETAIL.sub("", str(error)).strip()) from None

    def _compile(self, spec: GrammarSpec):
        compiler = self.compiler
        if spec.kind == "json":
            return compiler.compile_json_schema(spec.source, strict_mode=False, **_json_whitespace(spec.whitespace))
        if spec.kind == "regex":
            return compiler.compile_regex(spec.source)
        if spec.kind == "choice":
            choices = json.loads(spec.source)
            return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices))
        if spec.kind == "grammar":
            if _LARK.search(spec.source):
                return compiler.compile_lark(spec.source)
            return compiler.compile_grammar(spec.source)
        if spec.kind == "structural_tag":
            return compiler.compile_structural_tag(self._structural_tag(spec.source))
        raise ValueError(f"kind {spec.kind!r} is not one the xgrammar backend compiles")

    def _structural_tag(self, source: str):
        """xgrammar's StructuralTag of the `{"structures": [...], "triggers": [...]}` JSON (grammar.py
        `structural_tag_parts`)."""
        xgr = self._xgr
        structures, triggers = structural_tag_parts(source)
        items = [xgr.StructuralTagItem(**structure) for structure in structures]
        return xgr.StructuralTag.from_legacy_structural_tag(items, triggers)

    def matcher(self, compiled):
        """A fresh matcher of a compiled grammar, at its start."""
        return self._xgr.GrammarMatcher(compiled)

    def accept_token(self, matcher, token_id: int) -> bool:
        """Advance by one sampled token; False when the grammar rejects it (the matcher does not move)."""
        return matcher.accept_token(token_id)

    def rollback(self, matcher, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        matcher.rollback(num_tokens)

    def fill_bitmask(self, matchers: list, bitmask: np.ndarray) -> None:
        """Row i of bitmask [len(matchers), words] int32 (C-contiguous) := the allowed tokens of
        matchers[i]. xgrammar writes through a torch tensor sharing the array's memory (no copy),
        all rows in one call on its own threads."""
        self.batch.batch_fill_next_token_bitmask(matchers, self._torch.from_numpy(bitmask))


def _json_whitespace(whitespace: str) -> dict:
    """compile_json_schema's whitespace arguments for a GrammarSpec's `whitespace` (module docstring)."""
    if whitespace == "":
        return {"any_whitespace": False, "separators": (",", ":")}
    if whitespace == WHITESPACE_BOUNDED:
        return {"any_whitespace": True, "max_whitespace_cnt": MAX_WHITESPACE}
    raise ValueError(f"whitespace_pattern {whitespace!r}: the xgrammar backend takes no whitespace regex (only "
                     "disable_any_whitespace or the bounded default); use guided_decoding_backend='guidance'")


def _hf_tokenizer(tokenizer):
    """The transformers tokenizer itself, or the one a wrapper such as Ernie4_5Tokenizer holds."""
    hf = transformers_tokenizer(tokenizer)
    if hf is None:
        raise ValueError(f"the xgrammar backend needs a transformers tokenizer; {type(tokenizer).__name__} is not one")
    return hf
