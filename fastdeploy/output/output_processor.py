"""Per-token output handling: append, detokenize, and decide whether the request is finished.

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
from typing import Optional

from fastdeploy.engine.request import Request


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


def append_token(request: Request, token_id: int) -> bool:
    """Add `token_id` to `request`; sets finish_reason/stop_reason and returns True when it ends."""
    params = request.sampling_params
    request.output_token_ids.append(token_id)
    num_generated = len(request.output_token_ids)
    if token_id in request.eos_token_ids and not params.ignore_eos:
        request.finish_reason = "stop"
    elif params.stop_token_ids and token_id in params.stop_token_ids:
        request.finish_reason, request.stop_reason = "stop", token_id
    if request.finish_reason is not None:
        if params.include_stop_str_in_output:
            request.detokenizer.add_token(token_id)
        return True
    piece = request.detokenizer.add_token(token_id)
    if params.stop_strings and piece and num_generated >= params.min_tokens:
        match = _find_stop_string(request.detokenizer.text, len(piece), params.stop_strings,
                                  params.include_stop_str_in_output)
        if match is not None:
            request.finish_reason, request.stop_reason = "stop", match[0]
            request.detokenizer.text = request.detokenizer.text[: match[1]]
    if request.finish_reason is None and num_generated >= request.max_tokens:
        request.finish_reason = "length"
    return request.finish_reason is not None
