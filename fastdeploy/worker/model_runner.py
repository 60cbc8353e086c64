"""Model runner: SchedulerOutput -> one ragged batch -> forward -> one sampled token per request.

Owns the model, the KV cache and its own state of every request it serves (`CachedRequestState`,
built from the scheduler's `NewRequestData` and kept up to date from the per-step diffs); it never
sees an engine `Request`. The batch is ordered by query length (decodes first), so the attention
backend can attend neighbours of similar length together. A request samples a token only when this
step brings its whole sequence into the cache (a prompt chunk that leaves tokens for later samples
nothing). Requests asking for prompt logprobs also get logits at every prompt position of their
chunk that predicts a prompt token not yet scored. A step that schedules image/video placeholder
tokens hands the model `inputs_embeds` with the encoder's rows there (worker/multimodal.py), and
input_ids as well (a multimodal MoE routes on them).

Speculative decoding (spec_decode/): a request the scheduler gives drafts
(`SchedulerOutput.scheduled_spec_decode_tokens`) computes its last token and the drafts in the same
ragged batch, samples every one of those rows as the non-speculative steps would have
(`worker/verify_rows.py`), and keeps the drafts up to the first that differs from its row's sample
(spec_decode/verify.py); the K/V of the rejected ones stay in slots past its tokens and are
overwritten later. After sampling, the proposer (n-gram lookup, a draft model) proposes the drafts of
the requests in `spec_decode_req_ids` for their next step.

Pipeline parallelism (distributed/parallel_state.py `PipelineStage`): a stage after the first receives
the previous stage's hidden states for the step's tokens in place of the embeddings, a stage before
the last sends its layers' output on and samples nothing; the last stage samples. The stages before
the last learn the sampled tokens from the scheduler (`CachedRequestData.new_token_ids`) when it
schedules the request again.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import paddle

from fastdeploy.config import FDConfig
from fastdeploy.distributed.parallel_state import get_pp_stage
from fastdeploy.engine.sched.output import GrammarBitmask, SchedulerOutput
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers import pooler
from fastdeploy.model_executor.layers.kv_cache import allocate_model_kv_caches
from fastdeploy.model_executor.layers.sample.sampler import sample
from fastdeploy.model_executor.logits_processor import build_logits_processors
from fastdeploy.model_executor.ops.logprobs import token_logprobs
from fastdeploy.platforms.cpu import collapse_into_huge_pages
from fastdeploy.spec_decode.proposer import make_proposer
from fastdeploy.spec_decode.verify import accepted_tokens, num_rejected
from fastdeploy.worker.output import ModelRunnerOutput, PromptLogprobsOutput
from fastdeploy.worker.multimodal import inputs_embeds, multimodal_rows, release_encoder_outputs
from fastdeploy.worker.request_state import CachedRequestState
from fastdeploy.worker.sampling_inputs import num_logprobs, sampling_metadata
from fastdeploy.worker.verify_rows import verify_rows

PROMPT_LOGPROBS_ROWS = 256  # prompt positions scored at once (bounds the [rows, vocab] temporaries)


class ModelRunner:
    def __init__(self, fd_config: FDConfig, model, samples: bool = True):
        """`samples`: this runner samples the tokens (False on tensor-parallel ranks other than 0 and on
        pipeline stages before the last), so it builds the LLM's logits processors."""
        self.config = fd_config
        self.model = model
        self.samples = samples
        self.stage = get_pp_stage()  # the model's: which layers (and so which KV caches) it holds
        self.block_size = fd_config.cache_config.block_size
        self.vocab_size = fd_config.model_config.vocab_size
        self.rng = np.random.default_rng(fd_config.seed)  # draws of unseeded requests
        self.requests: dict[str, CachedRequestState] = {}
        self.logits_processors = build_logits_processors(fd_config) if samples else []
        self.kv_caches = self._allocate_kv_caches()
        self.proposer = make_proposer(fd_config) if samples and fd_config.speculative_config is not None else None
        self.huge_page_bytes = collapse_into_huge_pages(model.parameters())  # decode streams them every step

    def _allocate_kv_caches(self) -> list:
        """One KVCache per layer, `num_blocks` blocks each, of the cache config's dtype (see
        layers/kv_cache.py for the layout)."""
        mc, cc = self.config.model_config, self.config.cache_config
        if mc.encoder_only:  # attends within the step only: no cache
            return []
        return allocate_model_kv_caches(mc, cc.num_blocks, self.block_size, cc.dtype, self.stage.layers)

    # ---- state --------------------------------------------------------------------------------
    def _update_states(self, out: SchedulerOutput) -> None:
        """Apply the step's diffs: drop finished and preempted requests, add new ones, extend block tables."""
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            self.requests.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            self.requests[new.req_id] = CachedRequestState.from_new(new)  # replaces a stale copy
        for cached in out.scheduled_cached_reqs:
            state = self.requests[cached.req_id]
            del state.block_ids[cached.num_kept_blocks :]
            state.block_ids.extend(cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens
            if not self.stage.is_last:  # the last stage sampled them
                state.output_token_ids.extend(cached.new_token_ids)

    # ---- the step ------------------------------------------------------------------------------
    @paddle.no_grad()
    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step; returns the sampled tokens (and logprobs) of the requests that sample."""
        self._update_states(out)
        result = ModelRunnerOutput()
        if out.is_empty:
            return result
        order = sorted(out.num_scheduled_tokens.items(), key=lambda item: item[1])  # decodes first
        scheduled = [(self.requests[req_id], n) for req_id, n in order]
        drafts = out.scheduled_spec_decode_tokens
        (input_ids, positions, meta, logits_indices), samplers, prompt_rows, poolers = self._prepare(scheduled, drafts)
        mm_rows = multimodal_rows(self.model, scheduled) if any(s.mm_features for s, _ in scheduled) else []
        embeds = inputs_embeds(self.model, input_ids, mm_rows) if mm_rows else None
        if not self.stage.is_first:  # the previous stage's output for these tokens
            embeds = self._receive_hidden(input_ids.shape[0])
        hidden = self.model(input_ids, positions, meta, embeds)  # [num_tokens, hidden]
        if not self.stage.is_last:
            self._send_hidden(hidden)
            for state, n in scheduled:
                state.num_computed_tokens += n
            return result
        if poolers:
            result.pooler_output = self._pool(np.from_dlpack(hidden), poolers)
        sample_drafts = [drafts.get(state.req_id, []) for state in samplers]
        num_sample_rows = len(samplers) + sum(map(len, sample_drafts))
        if samplers or prompt_rows:
            logits = self.model.compute_logits(paddle.gather(hidden, logits_indices))  # [sample + prompt rows, vocab]
            logits = np.from_dlpack(logits)  # zero-copy view; see layers/sample/sampler.py
        if prompt_rows:
            result.prompt_logprobs = self._prompt_logprobs(logits[num_sample_rows:], prompt_rows)
        for state, n in scheduled:
            state.num_computed_tokens += n
            if state.encoder_outputs:
                release_encoder_outputs(state)
        if samplers:
            tokens, all_logprobs = self._sample(logits[:num_sample_rows], samplers, sample_drafts, out.grammar_bitmask)
            for state, kept, step_drafts, logprobs in zip(samplers, tokens, sample_drafts, all_logprobs):
                state.num_computed_tokens -= num_rejected(step_drafts, kept)  # their slots are not the sequence's
                state.output_token_ids.extend(kept)
                result.sampled_token_ids[state.req_id] = kept
                if step_drafts:
                    result.num_draft_tokens[state.req_id] = len(step_drafts)
                if logprobs is not None:
                    result.logprobs[state.req_id] = logprobs
            if self.proposer is not None:
                proposing = [state for state in samplers if state.req_id in out.spec_decode_req_ids]
                result.draft_token_ids = self.proposer.propose(proposing) if proposing else {}
        return result

    def _receive_hidden(self, num_tokens: int) -> paddle.Tensor:
        """The previous pipeline stage's output for this step's tokens, [num_tokens, hidden] float32."""
        return self.stage.link.recv(num_tokens, self.config.model_config.hidden_size)

    def _send_hidden(self, hidden: paddle.Tensor) -> None:
        """This stage's output [num_tokens, hidden] to the next pipeline stage."""
        self.stage.link.send(hidden)

    def _sample(self, logits: np.ndarray, samplers: list[CachedRequestState], drafts: list[list[int]],
                grammar: Optional[GrammarBitmask]) -> tuple[list[list[int]], list]:
        """(tokens kept, their logprobs or None) of each sampler from logits [rows, vocab]: one row per
        sampler, or 1 + its drafts' rows for one verifying drafts (the drafts kept up to the first that
        its row's sample rejects, then that sample). Rows of constrained requests are masked by the
        step's grammar bitmask (waited for here), one mask per verified row."""
        rows, owners = verify_rows(samplers, drafts)  # a row's sampling state; [samplers + 1] first rows
        metadata = sampling_metadata(rows, self.rng, self.vocab_size, self.config.logprobs_mode,
                                     self.logits_processors)
        if grammar is not None:
            row_of = {state.req_id: owners[i] for i, state in enumerate(samplers)}
            metadata.grammar_rows = np.array([row_of[req_id] + position for req_id, position
                                              in zip(grammar.req_ids, grammar.positions)], np.int64)
            metadata.grammar_bitmask = grammar.bitmask()
        sampled = sample(logits, metadata)
        targets = sampled.token_ids.tolist()
        tokens, logprobs = [], []
        for i, step_drafts in enumerate(drafts):
            first = owners[i]
            kept = accepted_tokens(targets[first : owners[i + 1]], step_drafts)
            tokens.append(kept)
            parts = sampled.logprobs[first : first + len(kept)]
            logprobs.append(_concat_logprobs(parts) if parts[0] is not None else None)
        return tokens, logprobs

    def _prepare(self, scheduled: list[tuple[CachedRequestState, int]], drafts: dict[str, list[int]]):
        """The model's inputs (input_ids [n], positions [n] or [3, n], ForwardMeta, logits_indices
        [rows]), the states that sample (in row order; one verifying drafts has its last token's row
        and its drafts' rows), prompt-logprob rows (state, position, flattened row), and the pooling
        requests whose prompt is whole in this step (state, first row, end row)."""
        input_ids, positions, token_types, sample_rows, samplers, prompt_rows, poolers = [], [], [], [], [], [], []
        for state, n in scheduled:
            step_drafts = drafts.get(state.req_id, ())
            start, end = state.num_computed_tokens, state.num_computed_tokens + n - len(step_drafts)
            first_row = len(input_ids)
            input_ids += state.token_ids_between(start, end)
            input_ids += step_drafts
            positions.append(state.positions_between(start, end + len(step_drafts)))
            if state.token_type_ids is not None:
                token_types.append((first_row, state.token_types_between(start, end)))
            if state.pooling_params is not None:
                if start != 0 or end != state.num_tokens:  # pooling runners prefill whole prompts
                    raise RuntimeError(f"pooling request {state.req_id} was scheduled in part: tokens {start}-{end}")
                poolers.append((state, first_row, len(input_ids)))
            elif end == state.num_tokens:
                sample_rows += range(len(input_ids) - 1 - len(step_drafts), len(input_ids))
                samplers.append(state)
            if state.wants_prompt_logprobs:
                # logits at position p score prompt token p + 1
                first = max(start, state.num_prompt_logprobs_done - 1)
                prompt_rows += [(state, p, first_row + p - start)
                                for p in range(first, min(end, state.num_prompt_tokens - 1))]
        meta = ForwardMeta.build(
            seq_lens_this_time=[n for _, n in scheduled],
            seq_lens_decoder=[state.num_computed_tokens for state, _ in scheduled],
            block_tables=[state.block_ids for state, _ in scheduled],
            block_size=self.block_size,
            caches=self.kv_caches,
            token_type_ids=_token_type_ids(token_types, len(input_ids)),
        )
        logits_indices = (sample_rows + [row for _, _, row in prompt_rows]) or [0]
        inputs = (as_paddle(np.asarray(input_ids, dtype=np.int64)),
                  as_paddle(np.concatenate(positions, axis=-1)), meta,
                  as_paddle(np.asarray(logits_indices, dtype=np.int64)))
        return inputs, samplers, prompt_rows, poolers

    def _pool(self, hidden: np.ndarray, poolers: list) -> dict[str, np.ndarray]:
        """The pooling output of each (state, first row, end row) from the step's hidden [num_tokens, hidden]
        (layers/pooler.py): embeddings, or the classification head's probabilities (or logits), or per-token
        rewards."""
        config = self.config.pooler_config
        results, heads = {}, []
        for state, start, end in poolers:
            params = state.pooling_params
            kind = "ALL" if params.task == "reward" else config.pooling_type
            pooled = pooler.pool(hidden, start, end, kind)  # [hidden] or [tokens, hidden]
            if params.task == "embed":
                results[state.req_id] = pooler.embedding(pooled, params.dimensions, params.normalize)
            else:
                heads.append((state, pooled))
        if heads:
            rows = np.concatenate([pooled.reshape(-1, pooled.shape[-1]) for _, pooled in heads])  # [m, hidden]
            logits = np.from_dlpack(self.model.classify(as_paddle(np.ascontiguousarray(rows))))  # [m, labels]
            first = 0
            for state, pooled in heads:
                count = 1 if pooled.ndim == 1 else len(pooled)
                out = logits[first : first + count].copy()
                first += count
                params = state.pooling_params
                if params.task == "reward":
                    results[state.req_id] = out  # [tokens, labels]
                else:
                    results[state.req_id] = pooler.activation(out[0]) if params.activation else out[0]
        return results

    def _prompt_logprobs(self, x: np.ndarray, prompt_rows: list) -> dict[str, PromptLogprobsOutput]:
        """Raw logprobs of the prompt tokens at `prompt_rows` (state, position, row) from logits x [m, vocab]."""
        by_request: dict[str, list[int]] = {}
        for i, (state, _, _) in enumerate(prompt_rows):
            by_request.setdefault(state.req_id, []).append(i)
        results = {}
        for req_id, indices in by_request.items():
            state = prompt_rows[indices[0]][0]
            positions = np.array([prompt_rows[i][1] for i in indices], dtype=np.int64)
            actual = np.asarray(state.prompt_token_ids, dtype=np.int64)[positions + 1]
            k = num_logprobs(state.sampling_params.prompt_logprobs, self.vocab_size)
            parts = [token_logprobs(x[np.asarray(indices[lo : lo + PROMPT_LOGPROBS_ROWS])],
                                    actual[lo : lo + PROMPT_LOGPROBS_ROWS], k)
                     for lo in range(0, len(indices), PROMPT_LOGPROBS_ROWS)]
            state.num_prompt_logprobs_done = int(positions[-1]) + 2
            results[req_id] = PromptLogprobsOutput(positions + 1, _concat_logprobs(parts))
        return results


def _token_type_ids(parts: list[tuple[int, np.ndarray]], num_tokens: int):
    """[num_tokens] int64 modality ids of the step (0 text) when any request has non-text tokens, else None."""
    if not parts:
        return None
    types = np.zeros(num_tokens, dtype=np.int64)
    for first_row, part in parts:
        types[first_row : first_row + len(part)] = part
    return as_paddle(types)


def _concat_logprobs(parts: list):
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    return type(first)(**{name: np.concatenate([getattr(p, name) for p in parts])
                          for name in first.__dataclass_fields__})
