"""Incremental detokenization: text grows by the new token's piece, never re-decoding the sequence.

Fast tokenizers use `tokenizers.decoders.DecodeStream`, which keeps a short window of ids and
emits text only once it forms complete UTF-8 (so a multi-byte character split over several
byte-level tokens never shows a replacement character). Slow tokenizers (sentencepiece) use the
same idea on a window of ids: decode window and window + new, emit the difference unless it ends
in an incomplete character (vLLM's prefix/read offsets).
"""

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.text = ""
        if getattr(tokenizer, "is_fast", False):
            from tokenizers.decoders import DecodeStream

            # Prefilling with the prompt's tail gives the decoder its left context (spaces, bytes).
            self._stream = DecodeStream(ids=list(prompt_token_ids[-4:]), skip_special_tokens=skip_special_tokens)
        else:
            self._stream = None
            self._ids = list(prompt_token_ids[-4:])
            self._prefix_offset = 0
            self._read_offset = len(self._ids)

    def add_token(self, token_id: int) -> str:
        """Append one generated token; returns the text it completes ('' if none yet)."""
        if self._stream is not None:
            piece = self._stream.step(self.tokenizer.backend_tokenizer, token_id) or ""
        else:
            piece = self._window_step(token_id)
        self.text += piece
        return piece

    def _window_step(self, token_id: int) -> str:
        self._ids.append(token_id)
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)  # noqa: E731
        before = decode(self._ids[self._prefix_offset : self._read_offset])
        after = decode(self._ids[self._prefix_offset :])
        if len(after) <= len(before) or after.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return after[len(before) :]
