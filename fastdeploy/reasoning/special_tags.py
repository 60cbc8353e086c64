"""Reasoning split on token ids: the parser's tags survive even when they are special tokens.

A completion's `text` is detokenized with the request's `skip_special_tokens` (True by default).
When a parser's tag (`<think>`, `</think>`, `<response>`, `<tool_call>` ...) is a *special* token
of the tokenizer, that text has lost the tag and a text-only split silently fails (everything
lands in one field). Here the tags are put back where their tokens were, the parser splits that
text, and the tags the split did not consume are removed again, so both fields honour
`skip_special_tokens`: other special tokens (e.g. `<|im_end|>`) stay out, as in `text`.

How the tags are put back: the completion's token ids are detokenized again the way the engine
does it (`IncrementalDetokenizer`, with the prompt's tail as left context), recording at which
character of the text each special tag token sits. The engine's `text` is a prefix of that
(it may be cut at a stop string, or miss a stop token's text), so a tag is inserted when it sits
at or before the end of `text`. If the re-decoded text does not start with `text` (a tokenizer
whose decoding depends on more context than that), the plain text split is used, as before.

FastDeploy's parsers work on ids for streaming (`think_end_token_id in delta_token_ids`) and on
text otherwise; vLLM's on text. Limitation: a tag left over after the split (e.g. `<think>` in
ernie-45-vl's reasoning) is removed by its text, so a literal spelling of the same tag made of
ordinary tokens in the same completion is removed too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Tuple

from fastdeploy.output.detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from fastdeploy.reasoning.base import ReasoningParser


def special_tag_ids(tokenizer, tags: Sequence[str]) -> dict[int, str]:
    """{token id: tag} for each of `tags` that `tokenizer` holds as a special token, i.e. one that
    decoding with skip_special_tokens=True drops (transformers' added tokens with special=True,
    and the named special tokens such as eos)."""
    found = {}
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False) and str(added) in tags:
            found[token_id] = str(added)
    for token_id in getattr(tokenizer, "all_special_ids", None) or ():
        token = tokenizer.convert_ids_to_tokens(token_id)
        if token in tags:
            found[token_id] = token
    return found


def split_with_special_tags(parser: "ReasoningParser", text: str, token_ids: Sequence[int], tokenizer,
                            skip_special_tokens: bool,
                            prompt_token_ids: Sequence[int] = ()) -> Tuple[Optional[str], str]:
    """(reasoning_content, content) of one finished completion.

    text: the completion's detokenized text (with `skip_special_tokens` applied, stop handling done).
    token_ids: the completion's generated token ids (as `CompletionOutput.token_ids`).
    prompt_token_ids: the prompt's ids; their tail is the detokenizer's left context.
    Without special tags among `token_ids` (or with skip_special_tokens=False, where `text` keeps
    them) this is `parser.extract(text)`.
    """
    if not skip_special_tokens:
        return parser.extract(text)
    tags = special_tag_ids(tokenizer, parser.tags)
    present = {tags[t] for t in token_ids if t in tags}
    if not present:
        return parser.extract(text)
    marked = _text_with_tags(tokenizer, token_ids, tags, prompt_token_ids, text)
    if marked is None:
        return parser.extract(text)
    reasoning, content = parser.extract(marked)
    return (None if reasoning is None else _without(reasoning, present)), _without(content, present)


def _text_with_tags(tokenizer, token_ids: Sequence[int], tags: dict[int, str],
                    prompt_token_ids: Sequence[int], text: str) -> Optional[str]:
    """`text` with each special tag put back at its token's place; None if the ids re-decode
    to a text that does not start with `text`."""
    detokenizer = IncrementalDetokenizer(tokenizer, list(prompt_token_ids), skip_special_tokens=True)
    places = []  # (character offset in the plain text, tag)
    for token_id in token_ids:
        if token_id in tags:
            places.append((len(detokenizer.text), tags[token_id]))
        detokenizer.add_token(token_id)
    if not detokenizer.text.startswith(text):
        return None
    parts, start = [], 0
    for offset, tag in places:
        if offset > len(text):
            break
        parts += [text[start:offset], tag]
        start = offset
    parts.append(text[start:])
    return "".join(parts)


def _without(piece: str, tags: set) -> str:
    for tag in tags:
        piece = piece.replace(tag, "")
    return piece
