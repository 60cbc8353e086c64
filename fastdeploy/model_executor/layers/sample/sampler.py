"""Token sampling for one step: penalties, logits processors and masks, then greedy argmax or a
filtered random draw.

Order (FastDeploy's sampler; vLLM's is the same but for its logit_bias and allowed_token_ids, which
come before its penalties): penalties (penalties.py) -> logits processors: `SamplingParams.logit_bias`
(logit_bias.py), then the LLM's `logits_processors` in order (model_executor/logits_processor/) ->
bans (EOS under min_tokens, bad words; tokens outside allowed_token_ids, allowed_tokens.py) -> the
grammar mask of constrained rows (structured outputs, token_bitmask.py) -> logits / temperature ->
softmax -> min-p (drop tokens below min_p x the top probability) -> top-k -> top-p (smallest prefix
of the sorted, renormalised distribution whose mass reaches top_p; the top token always kept) -> one
draw by inverse CDF. Logprobs come from the logits before all of it
("raw_logprobs") or after the masks and temperature ("processed_logprobs").
Temperature 0 is greedy: the exact argmax of the processed logits, ties to the lowest token id.

Each draw uses one uniform number per row, from the request's own generator when it is seeded
(worker/sampling_inputs.py), so a seeded request draws the same numbers in any batch.

The work is done on a zero-copy numpy view (DLPack) of the Paddle logits: for these shapes
([rows, vocab ~50k], float32) Paddle's CPU kernels are far slower (log_softmax [32, 49152] takes
seconds, topk(1024) 28 ms), and every step below is O(vocab) per row. Penalties and the draw run in
the compiled ops when they are built (ops/sampling.py: custom_ops/cpu_ops/penalties.cc and
sampling.cc, ~0.05 ms per row; logprobs: ops/logprobs.py), else in numpy (penalties.py, draw.py,
logprobs.py: the references).
"""
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from fastdeploy.model_executor.layers.sample.allowed_tokens import apply_allowed
from fastdeploy.model_executor.layers.sample.logit_bias import LogitBias, apply_logit_bias
from fastdeploy.model_executor.layers.sample.logprobs import LogprobsArrays
from fastdeploy.model_executor.layers.sample.penalties import PenaltyInputs, apply_bans
from fastdeploy.model_executor.ops.logprobs import token_logprobs
from fastdeploy.model_executor.logits_processor.base import apply_processors
from fastdeploy.model_executor.ops.sampling import apply_penalties_, top_k_top_p_min_p_sampling
from fastdeploy.model_executor.ops.token_bitmask import apply_token_bitmask_

RAW = "raw_logprobs"  # the other mode: "processed_logprobs"


@dataclass
class SamplingMetadata:
    """Per-step sampling inputs, one row per request that samples a token this step."""

    temperature: np.ndarray  # [rows] float, 0 = greedy
    top_k: np.ndarray  # [rows] int, 0 = off
    top_p: np.ndarray  # [rows] float in (0, 1]
    min_p: np.ndarray  # [rows] float in [0, 1]
    uniforms: np.ndarray  # [rows] float64 in [0, 1): the draw of each row
    banned: list  # (row, token ids) pairs masked this step (EOS under min_tokens, bad words)
    penalties: Optional[PenaltyInputs] = None  # None: no row has a penalty
    num_logprobs: Optional[np.ndarray] = None  # [rows] int, -1 = no logprobs for that row
    logprobs_mode: str = RAW  # RAW: before penalties/temperature; "processed_logprobs": after them
    logit_bias: Optional[LogitBias] = None  # None: no row has a logit_bias
    logits_processors: list = field(default_factory=list)  # LogitsProcessor instances, state updated for these rows
    allowed: list = field(default_factory=list)  # (row, disallowed mask [vocab] bool) of rows with allowed_token_ids
    grammar_bitmask: Optional[np.ndarray] = None  # [m, ceil(vocab / 32)] int32 masks of constrained rows
    grammar_rows: Optional[np.ndarray] = None  # [m] int64 row of each mask


@dataclass
class SamplerOutput:
    token_ids: np.ndarray  # [rows] int64
    logprobs: list  # [rows] LogprobsArrays (m = 1) or None


def sample(logits, md: SamplingMetadata) -> SamplerOutput:
    """Token ids (and requested logprobs) for logits [rows, vocab] float32 (a paddle.Tensor or a
    numpy array); the logits are overwritten (penalties, processors and bans applied in place)."""
    x = logits if isinstance(logits, np.ndarray) else np.from_dlpack(logits)  # [rows, vocab], in place
    rows = x.shape[0]
    wants = np.flatnonzero(md.num_logprobs >= 0) if md.num_logprobs is not None else np.zeros(0, np.int64)
    raw = x[wants] if len(wants) and md.logprobs_mode == RAW else None  # fancy index: a copy
    if md.penalties is not None:
        apply_penalties_(x, md.penalties)
    if md.logit_bias is not None:
        apply_logit_bias(x, md.logit_bias)
    apply_processors(x, md.logits_processors)
    apply_bans(x, md.banned)
    apply_allowed(x, md.allowed)
    if md.grammar_bitmask is not None:
        apply_token_bitmask_(x, md.grammar_bitmask, md.grammar_rows)
    tokens = top_k_top_p_min_p_sampling(x, md.temperature, md.top_k, md.top_p, md.min_p, md.uniforms)
    logprobs = [None] * rows
    if len(wants):
        source = raw if raw is not None else _divided_by_temperature(x[wants], md.temperature[wants])
        found = token_logprobs(source, tokens[wants], int(md.num_logprobs[wants].max()))  # top k of the largest k
        for i, r in enumerate(wants):
            logprobs[r] = _one_row(found, i, int(md.num_logprobs[r]))
    return SamplerOutput(tokens, logprobs)


def _one_row(found: LogprobsArrays, i: int, k: int) -> LogprobsArrays:
    """Row i of `found` with its top k (the top lists are ordered, so a shorter one is a prefix)."""
    return LogprobsArrays(found.top_ids[i : i + 1, :k], found.top_logprobs[i : i + 1, :k],
                          found.top_ranks[i : i + 1, :k], found.token_logprobs[i : i + 1], found.token_ranks[i : i + 1])


def _divided_by_temperature(rows: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """rows [m, vocab] / temperature [m] in float32, in place; greedy rows (temperature 0) unchanged."""
    rows /= np.where(temperature > 0, temperature, 1.0).astype(np.float32)[:, None]
    return rows
