"""Draft-model proposals: a smaller checkpoint of the zoo, sharing the target's tokenizer, proposes
k tokens greedily, one forward per token.

The draft has its own KV cache, allocated with the target's number of blocks and addressed by the
target's block tables: a request's blocks hold the target's K/V in the target's cache and the
draft's K/V in the draft's. The draft catches up lazily: for each request that proposes, one ragged
forward computes the tokens the draft has not seen yet (its prompt the first time, then the tokens
accepted since its last proposal and the newly sampled one), whose last row gives the first draft;
k - 1 single-token forwards give the rest, their K/V written in the slots past the request's tokens
(the scheduler reserves them as lookahead). The K/V of drafts is never kept: the next proposal feeds
from the request's last token again. A request the runner sees anew (admission, preemption,
rollback) has the draft compute all its tokens, so no prefix-cache block is trusted to hold the
draft's K/V.

Greedy drafts are deterministic given the sequence, so the target_match verification
(spec_decode/verify.py) keeps the target distribution exactly.
"""
from __future__ import annotations

import numpy as np
import paddle

from fastdeploy.config import FDConfig
from fastdeploy.distributed.parallel_state import SINGLE, get_tp_group, set_tp_group
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.kv_cache import allocate_model_kv_caches


class DraftModelProposer:
    def __init__(self, fd_config: FDConfig):
        from fastdeploy.model_executor.model_loader import open_model
        from fastdeploy.model_executor.models import get_model_class

        spec = fd_config.speculative_config
        draft, cache = spec.draft, fd_config.cache_config
        self.k, self.block_size = spec.num_speculative_tokens, cache.block_size
        self.vocab_size = min(fd_config.model_config.vocab_size, draft.model_config.vocab_size)
        _, source = open_model(draft.path)
        model_cls = get_model_class(draft.model_config.architecture)
        group = get_tp_group()
        set_tp_group(SINGLE)  # the draft runs whole on the rank that samples
        try:
            self.model = model_cls(draft.model_config, cache.block_size,
                                   fd_config.scheduler_config.max_model_len + self.k, draft.quant_config)
        finally:
            set_tp_group(group)
        self.model.load_weights(source.weights())
        self.caches = allocate_model_kv_caches(draft.model_config, cache.num_blocks, cache.block_size,
                                               draft.kv_cache_dtype)

    @paddle.no_grad()
    def propose(self, states: list) -> dict[str, list[int]]:
        """Up to k greedy drafts per state (fewer where its blocks end sooner: the drafts' K/V must fit
        them)."""
        ks = {s.req_id: min(self.k, len(s.block_ids) * self.block_size - s.num_tokens + 1) for s in states}
        active = [s for s in states if ks[s.req_id] > 0]
        if not active:
            return {}
        chunks = [(s, s.token_ids_between(s.num_draft_computed_tokens, s.num_tokens), s.num_draft_computed_tokens)
                  for s in active]
        tokens = self._next_tokens(chunks)
        drafts = {s.req_id: [t] for s, t in zip(active, tokens)}
        for s in active:
            s.num_draft_computed_tokens = s.num_tokens
        for j in range(1, self.k):
            live = [s for s in active if ks[s.req_id] > j]
            if not live:
                break
            tokens = self._next_tokens([(s, drafts[s.req_id][-1:], s.num_tokens + j - 1) for s in live])
            for s, t in zip(live, tokens):
                drafts[s.req_id].append(t)
        return drafts

    def _next_tokens(self, chunks: list) -> list[int]:
        """The draft's greedy next token after each (state, token ids, first position) chunk, whose
        K/V it writes at those positions."""
        input_ids = np.concatenate([np.asarray(ids, dtype=np.int64) for _, ids, _ in chunks])
        positions = np.concatenate([np.arange(start, start + len(ids), dtype=np.int64) for _, ids, start in chunks])
        meta = ForwardMeta.build(
            seq_lens_this_time=[len(ids) for _, ids, _ in chunks],
            seq_lens_decoder=[start for _, _, start in chunks],
            block_tables=[s.block_ids for s, _, _ in chunks],
            block_size=self.block_size,
            caches=self.caches,
        )
        hidden = self.model(as_paddle(input_ids), as_paddle(positions), meta, None)  # [tokens, hidden]
        last = np.cumsum([len(ids) for _, ids, _ in chunks]) - 1
        logits = np.from_dlpack(self.model.compute_logits(paddle.gather(hidden, as_paddle(last))))  # [chunks, vocab]
        return np.argmax(logits[:, : self.vocab_size], axis=1).tolist()
