"""The backend behind `LLM(guided_decoding_backend=)`: "auto" and "guidance" -> llguidance (a base
requirement, guidance.py); "xgrammar" -> xgrammar (the optional `fastdeploy[xgrammar]` extra,
xgrammar_backend.py).

A backend provides `name`, `compile(spec) -> compiled` (ValueError with the fault), `matcher(compiled)`
(a fresh matcher), `accept_token(matcher, id) -> bool`, `is_terminated(matcher)` and
`fill_bitmask(matchers, bitmask)` (row i := the tokens matchers[i] allows, bit t % 32 of word t // 32).
"""
from __future__ import annotations


def make_backend(name: str, tokenizer, vocab_size: int, eos_token_ids):
    if name in ("auto", "guidance"):
        from fastdeploy.structured_output.guidance import GuidanceBackend

        return GuidanceBackend(tokenizer, vocab_size, eos_token_ids)
    raise ValueError(f"guided_decoding_backend {name!r} has no backend here; use 'auto' or 'guidance'")
