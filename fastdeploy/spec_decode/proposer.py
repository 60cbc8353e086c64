"""Draft proposers: after a step, the drafts of the requests that speculate in the next one.

`propose(states)` -> {req_id: drafts}, for the runner's request states that sampled in the step
(their output holds the new token) and may speculate next.
"""
from __future__ import annotations

import numpy as np

from fastdeploy.config import FDConfig
from fastdeploy.spec_decode.ngram import propose_ngram


class NgramProposer:
    """Prompt lookup (spec_decode/ngram.py) over each request's prompt and output."""

    def __init__(self, fd_config: FDConfig):
        spec = fd_config.speculative_config
        self.min_n, self.max_n, self.k = spec.min_ngram_size, spec.max_ngram_size, spec.num_speculative_tokens

    def propose(self, states: list) -> dict[str, list[int]]:
        proposals = {}
        for state in states:
            tokens = np.asarray(state.prompt_token_ids + state.output_token_ids, dtype=np.int64)
            drafts = propose_ngram(tokens, self.min_n, self.max_n, self.k)
            if drafts:
                proposals[state.req_id] = drafts
        return proposals


def make_proposer(fd_config: FDConfig):
    """The proposer of `fd_config.speculative_config.method`."""
    method = fd_config.speculative_config.method
    if method == "ngram":
        return NgramProposer(fd_config)
    if method == "draft_model":
        from fastdeploy.spec_decode.draft_model import DraftModelProposer

        return DraftModelProposer(fd_config)
    raise ValueError(f"speculative_config['method']={method!r} has no proposer in this engine")
