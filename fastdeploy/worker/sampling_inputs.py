"""Per-step sampling inputs of the requests that sample, from the runner's request states."""
from __future__ import annotations

from typing import Optional

import numpy as np

from fastdeploy.model_executor.layers.sample.allowed_tokens import disallowed_mask
from fastdeploy.model_executor.layers.sample.bad_words import banned_now
from fastdeploy.model_executor.layers.sample.logit_bias import LogitBias, bias_arrays
from fastdeploy.model_executor.layers.sample.penalties import PenaltyInputs, seen_tokens
from fastdeploy.model_executor.layers.sample.sampler import SamplingMetadata
from fastdeploy.model_executor.logits_processor import LogitsRow
from fastdeploy.worker.request_state import CachedRequestState


def num_logprobs(k: Optional[int], vocab_size: int) -> int:
    """A request's `logprobs`/`prompt_logprobs` as a count (-1 = the whole vocabulary)."""
    return vocab_size if k == -1 else k


def sampling_metadata(states: list[CachedRequestState], rng: np.random.Generator, vocab_size: int,
                      logprobs_mode: str, logits_processors: tuple = ()) -> SamplingMetadata:
    """One row per request in `states` (in order).

    Seeded requests draw from a generator keyed by (seed, completion index, tokens generated), so
    their tokens do not depend on the batch; the others draw from the engine's `rng`.
    Banned this step: bad words that the next token would complete, EOS / stop tokens while fewer
    than min_tokens are generated, and tokens outside allowed_token_ids. `logits_processors` (the
    runner's instances) get this step's rows (`update_state`) and run in the sampler.
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
        logit_bias=logit_bias_inputs(states),
        logits_processors=processors_for_step(states, logits_processors),
        allowed=allowed_masks(states, vocab_size),
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


def logit_bias_inputs(states: list[CachedRequestState]) -> Optional[LogitBias]:
    """The (row, token, bias) triples of the rows whose request has a logit_bias; None when none has."""
    entries = []
    for row, state in enumerate(states):
        if state.sampling_params.logit_bias:
            if state.logit_bias_arrays is None:
                state.logit_bias_arrays = bias_arrays(state.sampling_params.logit_bias)
            entries.append((row, *state.logit_bias_arrays))
    return LogitBias.from_rows(entries)


def allowed_masks(states: list[CachedRequestState], vocab_size: int) -> list:
    """(row, disallowed mask [vocab]) of the rows whose request has allowed_token_ids."""
    masks = []
    for row, state in enumerate(states):
        if state.sampling_params.allowed_token_ids:
            if state.disallowed_mask is None:
                state.disallowed_mask = disallowed_mask(state.sampling_params.allowed_token_ids, vocab_size)
            masks.append((row, state.disallowed_mask))
    return masks


def processors_for_step(states: list[CachedRequestState], processors) -> list:
    """`processors`, each told this step's rows (update_state); [] when there are none."""
    if processors:
        rows = [LogitsRow(s.req_id, s.sampling_params, s.sampling_params.logits_processors_args or {},
                          s.prompt_token_ids, s.output_token_ids) for s in states]
        for processor in processors:
            processor.update_state(rows)
    return list(processors)
