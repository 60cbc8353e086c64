"""Model runner: scheduled requests -> one ragged batch -> forward -> one sampled token per request.

Owns the model and the KV cache. The batch is ordered by query length (decodes first), so the
attention backend can attend neighbours of similar length together. A request samples a token
only when this step brings its whole sequence into the cache (a prompt chunk that leaves tokens
for later samples nothing).
"""
import numpy as np
import paddle

from fastdeploy.config import FDConfig
from fastdeploy.engine.request import Request
from fastdeploy.engine.sched.scheduler import ScheduledRequest
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.attention import allocate_kv_cache
from fastdeploy.model_executor.layers.sample.sampler import SamplingMetadata, sample


class ModelRunner:
    def __init__(self, fd_config: FDConfig, model, rng: np.random.Generator):
        self.config = fd_config
        self.model = model
        self.block_size = fd_config.cache_config.block_size
        self.rng = rng
        self.kv_caches = self._allocate_kv_caches()

    def _allocate_kv_caches(self) -> list:
        """One KVCache per layer, `num_blocks` blocks each (see layers/attention.py for the layout)."""
        mc = self.config.model_config
        num_blocks = self.config.cache_config.num_blocks
        return [allocate_kv_cache(num_blocks, mc.num_key_value_heads, self.block_size, mc.head_dim)
                for _ in range(mc.num_hidden_layers)]

    @paddle.no_grad()
    def execute(self, scheduled: list[ScheduledRequest]) -> list[tuple[Request, int]]:
        """Run one step; returns (request, sampled token id) for requests that sample."""
        order = sorted(scheduled, key=lambda s: s.num_new_tokens)  # decodes first: attention groups by length
        meta, sampling_requests = self._prepare(order)
        logits = self.model.forward(meta, self.kv_caches)  # [num_sampled, vocab]
        if not sampling_requests:
            return []
        tokens = sample(logits, self._sampling_metadata(sampling_requests))
        return list(zip(sampling_requests, tokens.tolist()))

    def _prepare(self, order: list[ScheduledRequest]):
        input_ids, positions, logits_indices, sampling_requests = [], [], [], []
        for s in order:
            start = s.request.num_computed_tokens
            input_ids += s.request.token_ids_between(start, start + s.num_new_tokens)
            positions.append(np.arange(start, start + s.num_new_tokens, dtype=np.int64))
            if start + s.num_new_tokens == s.request.num_tokens:
                logits_indices.append(len(input_ids) - 1)
                sampling_requests.append(s.request)
        meta = ForwardMeta.build(
            input_ids=input_ids,
            positions=np.concatenate(positions),
            seq_lens_this_time=[s.num_new_tokens for s in order],
            seq_lens_decoder=[s.request.num_computed_tokens for s in order],
            block_tables=[s.request.block_ids for s in order],
            block_size=self.block_size,
            logits_indices=logits_indices or [0],
        )
        return meta, sampling_requests

    def _sampling_metadata(self, requests: list[Request]) -> SamplingMetadata:
        banned = []
        uniforms = np.empty(len(requests))
        for row, request in enumerate(requests):
            params = request.sampling_params
            if len(request.output_token_ids) < params.min_tokens:
                banned.append((row, sorted(request.eos_token_ids | set(params.stop_token_ids or ()))))
            if params.seed is not None:
                uniforms[row] = np.random.default_rng([params.seed, len(request.output_token_ids)]).random()
            else:
                uniforms[row] = self.rng.random()
        return SamplingMetadata(
            temperature=np.array([r.sampling_params.temperature for r in requests], np.float64),
            top_k=np.array([r.sampling_params.top_k for r in requests], np.int64),
            top_p=np.array([r.sampling_params.top_p for r in requests], np.float64),
            min_p=np.array([r.sampling_params.min_p for r in requests], np.float64),
            uniforms=uniforms,
            banned=banned,
        )
