"""The backend behind `LLM(guided_decoding_backend=)`: "auto" and "guidance" -> llguidance (a base
requirement, guidance.py); "xgrammar" -> xgrammar (the optional `fastdeploy[xgrammar]` extra,
xgrammar_backend.py).

A backend provides `name`, `compile(spec) -> compiled` (ValueError with the fault), `matcher(compiled)`
(a fresh matcher), `accept_token(matcher, id) -> bool` and
`fill_bitmask(matchers, bitmask)` (row i := the tokens matchers[i] allows, bit t % 32 of word t // 32).
"""
from __future__ import annotations

XGRAMMAR_INSTALL = ('pip install torch==2.13.0 (the CPU wheel, first, as README.md does), then '
                    'pip install "fastdeploy[xgrammar]"')


def make_backend(name: str, tokenizer, vocab_size: int, eos_token_ids):
    if name in ("auto", "guidance"):
        from fastdeploy.structured_output.guidance import GuidanceBackend

        return GuidanceBackend(tokenizer, vocab_size, eos_token_ids)
    if name == "xgrammar":
        from fastdeploy.structured_output.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(tokenizer, vocab_size, eos_token_ids)
    raise ValueError(f"guided_decoding_backend {name!r} has no backend here; use 'auto', 'guidance' or 'xgrammar'")


def transformers_tokenizer(tokenizer):
    """The transformers tokenizer itself, or the one a wrapper such as Ernie4_5Tokenizer holds as
    `.tokenizer`; None when neither is one. Both backends read their vocabulary from it."""
    from transformers import PreTrainedTokenizerBase

    for candidate in (tokenizer, getattr(tokenizer, "tokenizer", None)):
        if isinstance(candidate, PreTrainedTokenizerBase):
            return candidate
    return None


def check_backend_installed(name: str) -> None:
    """Raise ImportError (naming the extra to install) when backend `name` needs a package that does
    not import; EngineArgs.validate calls it so that the LLM fails at construction, not at the first
    guided request."""
    if name == "xgrammar":
        import_xgrammar()


def import_xgrammar():
    """The xgrammar module; ImportError naming the `fastdeploy[xgrammar]` extra when it (or torch,
    which it imports) is missing."""
    try:
        import xgrammar
    except ImportError as error:
        raise ImportError(f"guided_decoding_backend='xgrammar' needs the xgrammar package, which does not import "
                          f"({error}): {XGRAMMAR_INSTALL}; or use guided_decoding_backend='auto' (llguidance, "
                          "installed with fastdeploy)") from error
    return xgrammar
