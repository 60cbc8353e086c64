"""Per-token output handling: append, detokenize, and decide whether the completion is finished.

Checks, in order, after each generated token (vLLM's order):
1. EOS (unless `ignore_eos`) -> finish_reason "stop", stop_reason None;
2. a token of `stop_token_ids` -> "stop", stop_reason = that id;
   in both cases the token stays in `token_ids` but its text is not added to `text` unless
   `include_stop_str_in_output` (vLLM's rule);
3. a stop string in the new text (searched only in the tail the new piece can complete, also
   across token boundaries) -> "stop", stop_reason = the string; the text is cut before it unless
   `include_stop_str_in_output`;
4. `max_tokens` generated -> "length".
EOS and stop tokens cannot appear before `min_tokens`: the sampler masks them; stop strings are not
checked before `min_tokens` either.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from fastdeploy.output.request_state import RequestState


def _find_stop_string(text: str, new_len: int, stops: list[str], include: bool) -> Optional[tuple[str, int]]:
    """(stop string, cut position) for the earliest stop string the new tail completes."""
    best = None
    for stop in stops:
        start = max(0, len(text) - new_len - len(stop) + 1)
        pos = text.find(stop, start)
        if pos != -1 and (best is None or pos < best[1]):
            best = (stop, pos)
    if best is None:
        return None
    stop, pos = best
    return stop, pos + len(stop) if include else pos


def append_token(state: "RequestState", token_id: int) -> bool:
    """Add `token_id` to the completion; sets finish_reason/stop_reason and returns True when it ends."""
    params = state.sampling_params
    state.output_token_ids.append(token_id)
    num_generated = len(state.output_token_ids)
    if token_id in state.eos_token_ids and not params.ignore_eos:
        state.finish_reason = "stop"
    elif params.stop_token_ids and token_id in params.stop_token_ids:
        state.finish_reason, state.stop_reason = "stop", token_id
    if state.finish_reason is not None:
        if params.include_stop_str_in_output:
            state.detokenizer.add_token(token_id)
        return True
    piece = state.detokenizer.add_token(token_id)
    if params.stop_strings and piece and num_generated >= params.min_tokens:
        match = _find_stop_string(state.detokenizer.text, len(piece), params.stop_strings,
                                  params.include_stop_str_in_output)
        if match is not None:
            state.finish_reason, state.stop_reason = "stop", match[0]
            state.detokenizer.text = state.detokenizer.text[: match[1]]
    if state.finish_reason is None and num_generated >= params.max_tokens:
        state.finish_reason = "length"
    return state.finish_reason is not None
