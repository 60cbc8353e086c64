"""Per-step sampling inputs of the requests that sample, from the runner's request states."""
from __future__ import annotations

from typing import Optional

import numpy as np

from fastdeploy.model_executor.layers.sample.bad_words import banned_now
from fastdeploy.model_executor.layers.sample.penalties import PenaltyInputs, seen_tokens
from fastdeploy.model_executor.layers.sample.sampler import SamplingMetadata
from fastdeploy.worker.request_state import CachedRequestState


def num_logprobs(k: Optional[int], vocab_size: int) -> int:
    """A request's `logprobs`/`prompt_logprobs` as a count (-1 = the whole vocabulary)."""
    return vocab_size if k == -1 else k


def sampling_metadata(states: list[CachedRequestState], rng: np.random.Generator, vocab_size: int,
                      logprobs_mode: str) -> SamplingMetadata:
    """One row per request in `states` (in order).

    Seeded requests draw from a generator keyed by (seed, completion index, tokens generated), so
    their tokens do not depend on the batch; the others draw from the engine's `rng`.
    Banned this step: bad words that the next token would complete, and EOS / stop tokens while
    fewer than min_tokens are generated.
    """
    banned = []
    uniforms = np.empty(len(states))
    for row, state in enumerate(states):
        params = state.sampling_params
        ids = list(banned_now(state.bad_words_token_ids, state.output_token_ids))
        if len(state.output_token_ids) < params.min_tokens:
            ids += sorted(state.eos_token_ids | set(params.stop_token_ids or ()))
        if ids:
            banned.append((row, ids))
        if params.seed is not None:
            key = [params.seed, state.index, len(state.output_token_ids)]
            uniforms[row] = np.random.default_rng(key).random()
        else:
            uniforms[row] = rng.random()
    params = [s.sampling_params for s in states]
    return SamplingMetadata(
        temperature=np.array([p.temperature for p in params], np.float64),
        top_k=np.array([p.top_k for p in params], np.int64),
        top_p=np.array([p.top_p for p in params], np.float64),
        min_p=np.array([p.min_p for p in params], np.float64),
        uniforms=uniforms,
        banned=banned,
        penalties=penalty_inputs(states),
        num_logprobs=np.array([-1 if p.logprobs is None else num_logprobs(p.logprobs, vocab_size) for p in params],
                              np.int64),
        logprobs_mode=logprobs_mode,
    )


def penalty_inputs(states: list[CachedRequestState]) -> Optional[PenaltyInputs]:
    """Token counts of the rows with a repetition, frequency or presence penalty; None when no row has one."""
    params = [s.sampling_params for s in states]
    repetition = np.array([p.repetition_penalty for p in params], np.float32)
    frequency = np.array([p.frequency_penalty for p in params], np.float32)
    presence = np.array([p.presence_penalty for p in params], np.float32)
    active = np.flatnonzero((repetition != 1) | (frequency != 0) | (presence != 0))
    if not len(active):
        return None
    rows, ids, counts = [], [], []
    for row in active:
        state = states[row]
        if state.prompt_unique is None:
            state.prompt_unique = np.unique(np.asarray(state.prompt_token_ids, dtype=np.int64))
        row_ids, row_counts = seen_tokens(state.prompt_unique, state.output_token_ids)
        rows.append(np.full(len(row_ids), row, np.int64))
        ids.append(row_ids)
        counts.append(row_counts)
    return PenaltyInputs(np.concatenate(rows), np.concatenate(ids), np.concatenate(counts),
                         repetition, frequency, presence)
