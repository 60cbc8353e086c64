"""The runner's multimodal step: encoder outputs for the scheduled placeholder tokens, and the
`inputs_embeds` that carry them.

A request's images and videos (`CachedRequestState.mm_features`, multimodal/inputs.py) are encoded
when a step first schedules any of an item's placeholder tokens: `model.embed_multimodal(features)`
returns one [feature.length, hidden] tensor per feature (all the step's items in one call). The
output is kept per request (`CachedRequestState.encoder_outputs`, by item index) until the item's
last placeholder is in the KV cache, so a chunked prefill that splits an item, or a prefix-cache hit
that covers part of one, still runs the encoder once per item and uses only the rows it needs.
Preemption drops the runner's state, and with it the kept outputs; the item is encoded again when
the request returns. The step's embeddings are the text embeddings of its input ids with the rows
of placeholder tokens replaced by the encoder's rows.
"""
from __future__ import annotations

import numpy as np
import paddle


def overlap(feature, start: int, end: int) -> tuple[int, int]:
    """[lo, hi) of the prompt tokens of `feature` within tokens [start, end) (lo >= hi: none)."""
    return max(start, feature.offset), min(end, feature.offset + feature.length)


def multimodal_rows(model, scheduled: list) -> list[tuple[int, np.ndarray]]:
    """(first batch row, embeddings [rows, hidden]) for every scheduled run of placeholder tokens.

    scheduled: (CachedRequestState, tokens this step) in batch order. Encodes the items not yet
    encoded (one `embed_multimodal` call for the whole step) and keeps their outputs on the state.
    """
    missing = []
    for state, n in scheduled:
        start, end = state.num_computed_tokens, state.num_computed_tokens + n
        for i, feature in enumerate(state.mm_features):
            lo, hi = overlap(feature, start, end)
            if lo < hi and i not in state.encoder_outputs:
                missing.append((state, i))
    if missing:
        outputs = model.embed_multimodal([state.mm_features[i] for state, i in missing])
        for (state, i), output in zip(missing, outputs):
            state.encoder_outputs[i] = np.from_dlpack(output)
    rows, first_row = [], 0
    for state, n in scheduled:
        start, end = state.num_computed_tokens, state.num_computed_tokens + n
        for i, feature in enumerate(state.mm_features):
            lo, hi = overlap(feature, start, end)
            if lo < hi:
                rows.append((first_row + lo - start, state.encoder_outputs[i][lo - feature.offset : hi - feature.offset]))
        first_row += n
    return rows


def inputs_embeds(model, input_ids: paddle.Tensor, rows: list[tuple[int, np.ndarray]]) -> paddle.Tensor:
    """The step's embeddings [num_tokens, hidden]: model.embed_input_ids(input_ids) with `rows` put in."""
    embeds = model.embed_input_ids(input_ids)  # a new tensor: written in place through a numpy view
    view = np.from_dlpack(embeds)
    for first_row, values in rows:
        view[first_row : first_row + len(values)] = values
    return embeds


def release_encoder_outputs(state) -> None:
    """Drop the kept outputs of items whose placeholders are all in the KV cache."""
    for i in [i for i in state.encoder_outputs if state.mm_features[i].offset + state.mm_features[i].length
              <= state.num_computed_tokens]:
        del state.encoder_outputs[i]
