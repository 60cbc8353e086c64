"""Model runner: scheduled requests -> one ragged batch -> forward -> one sampled token per request.

Owns the model and the KV cache. The batch is ordered by query length (decodes first), so the
attention backend can attend neighbours of similar length together. A request samples a token
only when this step brings its whole sequence into the cache (a prompt chunk that leaves tokens
for later samples nothing). Requests asking for prompt logprobs also get logits at every prompt
position of their chunk that predicts a prompt token not yet scored.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np
import paddle

from fastdeploy.config import FDConfig
from fastdeploy.engine.request import Request
from fastdeploy.engine.sched.scheduler import ScheduledRequest
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.attention import allocate_kv_cache
from fastdeploy.model_executor.layers.sample.bad_words import banned_now
from fastdeploy.model_executor.layers.sample.logprobs import LogprobsArrays
from fastdeploy.model_executor.layers.sample.penalties import PenaltyInputs, seen_tokens
from fastdeploy.model_executor.layers.sample.sampler import SamplingMetadata, sample
from fastdeploy.model_executor.ops.logprobs import token_logprobs

PROMPT_LOGPROBS_ROWS = 256  # prompt positions scored at once (bounds the [rows, vocab] temporaries)


@dataclass
class SampledToken:
    request: Request
    token_id: int
    logprobs: Optional[LogprobsArrays]  # one position, when the request asked for logprobs


@dataclass
class PromptLogprobs:
    request: Request
    positions: np.ndarray  # [m] prompt positions scored (each >= 1)
    logprobs: LogprobsArrays


class ModelRunner:
    def __init__(self, fd_config: FDConfig, model, rng: np.random.Generator):
        self.config = fd_config
        self.model = model
        self.block_size = fd_config.cache_config.block_size
        self.vocab_size = fd_config.model_config.vocab_size
        self.rng = rng
        self.kv_caches = self._allocate_kv_caches()

    def _allocate_kv_caches(self) -> list:
        """One KVCache per layer, `num_blocks` blocks each (see layers/attention.py for the layout)."""
        mc = self.config.model_config
        num_blocks = self.config.cache_config.num_blocks
        return [allocate_kv_cache(num_blocks, mc.num_key_value_heads, self.block_size, mc.head_dim)
                for _ in range(mc.num_hidden_layers)]

    @paddle.no_grad()
    def execute(self, scheduled: list[ScheduledRequest]) -> tuple[list[SampledToken], list[PromptLogprobs]]:
        """Run one step: the sampled token of each request that samples, and prompt logprobs."""
        order = sorted(scheduled, key=lambda s: s.num_new_tokens)  # decodes first: attention groups by length
        (input_ids, positions, meta, logits_indices), sampling_requests, prompt_rows = self._prepare(order)
        hidden = self.model(input_ids, positions, meta)  # [num_tokens, hidden]
        # [num_sampled + num_prompt_rows, vocab]
        logits = self.model.compute_logits(paddle.gather(hidden, logits_indices))
        logits = np.from_dlpack(logits)  # zero-copy view; see layers/sample/sampler.py
        num_sampled = len(sampling_requests)
        scored = self._prompt_logprobs(logits[num_sampled:], prompt_rows) if prompt_rows else []
        if not sampling_requests:
            return [], scored
        out = sample(logits[:num_sampled], self._sampling_metadata(sampling_requests))
        sampled = [SampledToken(r, int(t), lp) for r, t, lp in zip(sampling_requests, out.token_ids, out.logprobs)]
        return sampled, scored

    def _prepare(self, order: list[ScheduledRequest]):
        input_ids, positions, sample_rows, sampling_requests, prompt_rows = [], [], [], [], []
        for s in order:
            request, start, end = s.request, s.request.num_computed_tokens, s.request.num_computed_tokens + s.num_new_tokens
            first_row = len(input_ids)
            input_ids += request.token_ids_between(start, end)
            positions.append(np.arange(start, end, dtype=np.int64))
            if end == request.num_tokens:
                sample_rows.append(len(input_ids) - 1)
                sampling_requests.append(request)
            if request.prompt_logprobs is not None:
                # logits at position p score prompt token p + 1
                scored = [p for p in range(start, min(end, request.num_prompt_tokens - 1))
                          if request.prompt_logprobs[p + 1] is None]
                prompt_rows += [(request, p, first_row + p - start) for p in scored]
        meta = ForwardMeta.build(
            seq_lens_this_time=[s.num_new_tokens for s in order],
            seq_lens_decoder=[s.request.num_computed_tokens for s in order],
            block_tables=[s.request.block_ids for s in order],
            block_size=self.block_size,
            caches=self.kv_caches,
        )
        logits_indices = (sample_rows + [row for _, _, row in prompt_rows]) or [0]
        batch = (paddle.to_tensor(np.asarray(input_ids, dtype=np.int64)), paddle.to_tensor(np.concatenate(positions)),
                 meta, paddle.to_tensor(np.asarray(logits_indices, dtype=np.int64)))
        return batch, sampling_requests, prompt_rows

    def _prompt_logprobs(self, x: np.ndarray, prompt_rows: list) -> list[PromptLogprobs]:
        """Raw logprobs of the prompt tokens at `prompt_rows` (request, position, row) from logits x [m, vocab]."""
        results = []
        by_request: dict[int, list[int]] = {}
        for i, (request, _, _) in enumerate(prompt_rows):
            by_request.setdefault(id(request), []).append(i)
        for indices in by_request.values():
            request = prompt_rows[indices[0]][0]
            positions = np.array([prompt_rows[i][1] for i in indices], dtype=np.int64)
            actual = np.asarray(request.prompt_token_ids, dtype=np.int64)[positions + 1]
            k = self._num_logprobs(request.sampling_params.prompt_logprobs)
            for lo in range(0, len(indices), PROMPT_LOGPROBS_ROWS):
                rows = np.asarray(indices[lo : lo + PROMPT_LOGPROBS_ROWS])
                arrays = token_logprobs(x[rows], actual[lo : lo + len(rows)], k)
                results.append(PromptLogprobs(request, positions[lo : lo + len(rows)] + 1, arrays))
        return results

    def _num_logprobs(self, k: Optional[int]) -> int:
        return self.vocab_size if k == -1 else k

    def _sampling_metadata(self, requests: list[Request]) -> SamplingMetadata:
        banned = []
        uniforms = np.empty(len(requests))
        for row, request in enumerate(requests):
            params = request.sampling_params
            ids = list(banned_now(request.bad_words_token_ids, request.output_token_ids))
            if len(request.output_token_ids) < params.min_tokens:
                ids += sorted(request.eos_token_ids | set(params.stop_token_ids or ()))
            if ids:
                banned.append((row, ids))
            if params.seed is not None:
                key = [params.seed, request.index, len(request.output_token_ids)]
                uniforms[row] = np.random.default_rng(key).random()
            else:
                uniforms[row] = self.rng.random()
        logprobs = [r.sampling_params.logprobs for r in requests]
        return SamplingMetadata(
            temperature=np.array([r.sampling_params.temperature for r in requests], np.float64),
            top_k=np.array([r.sampling_params.top_k for r in requests], np.int64),
            top_p=np.array([r.sampling_params.top_p for r in requests], np.float64),
            min_p=np.array([r.sampling_params.min_p for r in requests], np.float64),
            uniforms=uniforms,
            banned=banned,
            penalties=self._penalty_inputs(requests),
            num_logprobs=np.array([-1 if k is None else self._num_logprobs(k) for k in logprobs], np.int64),
            logprobs_mode=self.config.logprobs_mode,
        )

    @staticmethod
    def _penalty_inputs(requests: list[Request]) -> Optional[PenaltyInputs]:
        params = [r.sampling_params for r in requests]
        repetition = np.array([p.repetition_penalty for p in params], np.float32)
        frequency = np.array([p.frequency_penalty for p in params], np.float32)
        presence = np.array([p.presence_penalty for p in params], np.float32)
        active = np.flatnonzero((repetition != 1) | (frequency != 0) | (presence != 0))
        if not len(active):
            return None
        rows, ids, counts = [], [], []
        for row in active:
            request = requests[row]
            if request.prompt_unique is None:
                request.prompt_unique = np.unique(np.asarray(request.prompt_token_ids, dtype=np.int64))
            row_ids, row_counts = seen_tokens(request.prompt_unique, request.output_token_ids)
            rows.append(np.full(len(row_ids), row, np.int64))
            ids.append(row_ids)
            counts.append(row_counts)
        return PenaltyInputs(np.concatenate(rows), np.concatenate(ids), np.concatenate(counts),
                             repetition, frequency, presence)
