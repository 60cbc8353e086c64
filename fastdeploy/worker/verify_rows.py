"""The sampling rows of a verification step (speculative decoding).

A request verifying drafts d_1..d_k has k + 1 rows of logits; row j must be sampled as the
non-speculative decode would sample the token after d_1..d_j: penalties over the output extended by
them, min_tokens and bad words counted on it, and (seeded requests) the uniform number of that
position. `DraftRow` is the request's state as row j sees it, so worker/sampling_inputs.py builds
every row with the code that builds ordinary ones.
"""
from __future__ import annotations

from fastdeploy.worker.request_state import CachedRequestState


class DraftRow:
    """`state` with its output extended by `drafts` (its first j drafts, for row j); every other
    attribute, read or written (the sampler's per-request caches), is the state's own."""

    def __init__(self, state: CachedRequestState, drafts: list[int]):
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "output_token_ids", state.output_token_ids + drafts)

    def __getattr__(self, name: str):
        return getattr(self._state, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self._state, name, value)


def verify_rows(samplers: list[CachedRequestState], drafts: list[list[int]]) -> tuple[list, list[int]]:
    """(the row states in order: each sampler, then one DraftRow per draft it verifies; the first row
    of each sampler, [len(samplers) + 1] with the row count last)."""
    rows, firsts = [], [0]
    for state, step_drafts in zip(samplers, drafts):
        rows.append(state)
        rows += [DraftRow(state, step_drafts[:j]) for j in range(1, len(step_drafts) + 1)]
        firsts.append(len(rows))
    return rows, firsts
