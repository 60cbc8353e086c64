"""LLMEngine: add_request / step / abort. Owns the scheduler, the model runner and the tokenizer.

One `step()` = schedule -> run the model on the scheduled tokens -> append sampled tokens and
logprobs, detokenize, check stops -> free finished requests' blocks -> RequestOutputs of prompts
whose completions have all finished.

A prompt with `n` completions is a RequestGroup of n Requests (vLLM's parallel sampling): each is
scheduled, sampled and finished on its own; seeded ones draw from (seed, index, step).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

import numpy as np

from fastdeploy.cache_manager.block_pool import BlockPool
from fastdeploy.config import FDConfig
from fastdeploy.engine.args_utils import EngineArgs
from fastdeploy.engine.request import (
    CompletionOutput, CompletionOutputs, Request, RequestGroup, RequestMetrics, RequestOutput,
)
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.sched.scheduler import Scheduler
from fastdeploy.model_executor.layers.sample.bad_words import bad_words_token_ids
from fastdeploy.output.detokenizer import IncrementalDetokenizer
from fastdeploy.output.logprobs import TokenTexts, logprobs_dict
from fastdeploy.output.output_processor import append_token
from fastdeploy.platforms.cpu import set_paddle_threads
from fastdeploy.reasoning import get_reasoning_parser
from fastdeploy.worker.model_runner import ModelRunner

logger = logging.getLogger("fastdeploy")


def _eos_token_ids(tokenizer, generation_config: dict) -> frozenset:
    """EOS ids: generation_config.json's eos_token_id (int or list) plus the tokenizer's."""
    ids = generation_config.get("eos_token_id")
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


class LLMEngine:
    def __init__(self, fd_config: FDConfig, tokenizer, model):
        self.config = fd_config
        self.tokenizer = tokenizer
        self.eos_token_ids = _eos_token_ids(tokenizer, fd_config.generation_config)
        sc = fd_config.scheduler_config
        self.block_pool = BlockPool(fd_config.cache_config.num_blocks)
        self.scheduler = Scheduler(
            self.block_pool, fd_config.cache_config.block_size, sc.max_num_seqs,
            sc.max_num_batched_tokens, sc.enable_chunked_prefill, sc.enable_prefix_caching,
            sc.long_prefill_token_threshold,
        )
        self.runner = ModelRunner(fd_config, model, np.random.default_rng(fd_config.seed))
        self.groups: dict[str, RequestGroup] = {}
        self.token_texts = TokenTexts(tokenizer)
        self.reasoning_parser = get_reasoning_parser(fd_config.reasoning_parser) if fd_config.reasoning_parser else None
        self._next_id = 0

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> "LLMEngine":
        from fastdeploy.model_executor.model_loader import open_model
        from fastdeploy.model_executor.model_loader.hf_loader import load_hf_tokenizer
        from fastdeploy.model_executor.models import get_model_class

        threads = set_paddle_threads()
        start = time.perf_counter()
        path, source = open_model(args.model)
        if args.tokenizer is not None:
            source.tokenizer = load_hf_tokenizer(Path(args.tokenizer))
        model_cls = get_model_class(source.hf_config.get("architectures", [None])[0])
        config = args.create_engine_config(path, source.hf_config, source.generation_config)
        model = model_cls(config.model_config, config.cache_config.block_size, config.scheduler_config.max_model_len,
                          source.quant_config)
        model.load_weights(source.weights())
        logger.info("loaded %s in %.1f s on %d threads", path, time.perf_counter() - start, threads)
        return cls(config, source.tokenizer, model)

    # ---- requests ---------------------------------------------------------------------------
    def resolve_sampling_params(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        """A copy with the model's defaults filled in, max_tokens clamped to the context, and the
        checks that need the model (vocabulary, max_logprobs). Raises ValueError naming the field."""
        gen = self.config.generation_config
        room = self.config.scheduler_config.max_model_len - prompt_len
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)

        def pick(name, neutral):
            value = getattr(params, name)
            return value if value is not None else gen.get(name, neutral)

        resolved = params.clone(
            max_tokens=max_tokens,
            min_tokens=min(params.min_tokens, max_tokens),
            temperature=float(pick("temperature", 1.0)),
            top_p=float(pick("top_p", 1.0)),
            top_k=max(int(pick("top_k", 0)), 0),
            repetition_penalty=float(pick("repetition_penalty", 1.0)),
            presence_penalty=float(pick("presence_penalty", 0.0)),
            frequency_penalty=float(pick("frequency_penalty", 0.0)),
        )
        self._check_against_model(resolved)
        return resolved

    def _check_against_model(self, params: SamplingParams) -> None:
        vocab = self.config.model_config.vocab_size
        for name in ("stop_token_ids", "bad_words_token_ids"):
            bad = [t for t in getattr(params, name) or () if t >= vocab]
            if bad:
                raise ValueError(f"{name} holds {bad[0]}, outside the vocabulary [0, {vocab})")
        limit = self.config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is None:
                continue
            if limit is None:
                raise ValueError(f"{name}={k} was requested, but the LLM was made with enable_logprob=False")
            asked, allowed = (vocab if k == -1 else k), (vocab if limit == -1 else limit)
            if asked > allowed:
                raise ValueError(f"{name}={k} exceeds max_logprobs={limit}: ask for at most {limit} "
                                 "or raise LLM(max_logprobs=...) (-1 = the whole vocabulary)")

    def validate_prompt(self, prompt_token_ids: list[int], index: Optional[int] = None) -> None:
        """Raise ValueError for an empty prompt, an id outside the vocabulary or a prompt too long."""
        where = "" if index is None else f" (prompt {index})"
        max_len = self.config.scheduler_config.max_model_len
        vocab = self.config.model_config.vocab_size
        if len(prompt_token_ids) == 0:
            raise ValueError(f"prompt is empty{where}: at least one token is needed")
        if len(prompt_token_ids) >= max_len:
            raise ValueError(
                f"prompt has {len(prompt_token_ids)} tokens{where}, but max_model_len={max_len} leaves no "
                "room to generate: shorten the prompt or raise max_model_len"
            )
        bad = [t for t in prompt_token_ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]!r}{where} is outside the vocabulary [0, {vocab})")
        blocks = -(-len(prompt_token_ids) // self.config.cache_config.block_size)
        if blocks > self.block_pool.num_usable_blocks:
            raise ValueError(
                f"prompt{where} needs {blocks} KV blocks, the pool has {self.block_pool.num_usable_blocks}: "
                "raise num_gpu_blocks_override or gpu_memory_utilization"
            )

    def make_request(self, prompt: Optional[str], prompt_token_ids: list[int], params: SamplingParams,
                     index: Optional[int] = None) -> RequestGroup:
        """The validated `n` Requests of one prompt, each with its own resolved SamplingParams, not
        yet queued. Raises ValueError/TypeError (naming prompt `index` when given) before anything
        is queued."""
        self.validate_prompt(prompt_token_ids, index)
        resolved = self.resolve_sampling_params(params, len(prompt_token_ids))  # rejects greedy n > 1 too
        group_id = str(self._next_id)
        self._next_id += 1
        banned = bad_words_token_ids(self.tokenizer, resolved.bad_words or [], resolved.bad_words_token_ids or [],
                                     self.config.model_config.vocab_size)
        requests = []
        for i in range(resolved.n):
            request = Request(
                request_id=group_id if resolved.n == 1 else f"{group_id}-{i}",
                prompt=prompt,
                prompt_token_ids=list(prompt_token_ids),
                sampling_params=resolved,
                eos_token_ids=self.eos_token_ids,
                max_tokens=resolved.max_tokens,
                group_id=group_id,
                index=i,
                bad_words_token_ids=banned,
            )
            request.detokenizer = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids,
                                                         resolved.skip_special_tokens)
            if resolved.logprobs is not None:
                request.logprobs = []
            if resolved.prompt_logprobs is not None and i == 0:  # the n completions share the prompt
                request.prompt_logprobs = [None] * len(prompt_token_ids)
            requests.append(request)
        return RequestGroup(group_id, requests)

    def enqueue(self, group: RequestGroup) -> str:
        """Queue the requests made by make_request; returns the prompt's request_id."""
        self.groups[group.request_id] = group
        for request in group.requests:
            self.scheduler.add_request(request)
        return group.request_id

    def add_request(self, prompt: Optional[str], prompt_token_ids: list[int], params: SamplingParams) -> str:
        """Validate and queue one prompt (its `n` completions); returns its request_id."""
        return self.enqueue(self.make_request(prompt, prompt_token_ids, params))

    def abort_request(self, request_id: str) -> Optional[RequestOutput]:
        """Stop a prompt's unfinished completions now; their blocks return to the pool.
        Returns its output (finish_reason "abort" on the aborted completions), or None if unknown."""
        group = self.groups.pop(request_id, None)
        if group is None:
            return None
        for request in group.requests:
            if request.finish_reason is None:
                request.finish_reason = "abort"
                self.scheduler.finish(request)
        return self._make_output(group)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; later requests start with no prefix-cache hit. Returns True."""
        self.block_pool.reset_prefix_cache()
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one model step; returns the outputs of prompts whose completions all finished in it."""
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        now = time.time()
        for s in out.scheduled:
            if s.request.metrics.inference_start_time is None:
                s.request.metrics.inference_start_time = now
        sampled, prompt_scores = self.runner.execute(out.scheduled)
        for s in out.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
        for scores in prompt_scores:
            self._store_prompt_logprobs(scores)
        finished = []
        for item in sampled:
            request = item.request
            try:
                if item.logprobs is not None:
                    self._store_logprobs(request, item.token_id, item.logprobs)
                done = append_token(request, item.token_id)
            except Exception as e:  # this request fails alone; the rest of the batch goes on
                logger.exception("request %s failed while processing its output", request.request_id)
                request.finish_reason, request.error = "abort", f"{type(e).__name__}: {e}"
                done = True
            if len(request.output_token_ids) == 1 and request.metrics.first_token_time is None:
                self._stamp_first_token(request)
            if done:
                self.scheduler.finish(request)
                output = self._finish(request)
                if output is not None:
                    finished.append(output)
        return finished

    def _store_logprobs(self, request: Request, token_id: int, arrays) -> None:
        request.logprobs.append(logprobs_dict(arrays, 0, token_id, self.token_texts))
        request.cumulative_logprob += float(arrays.token_logprobs[0])

    def _store_prompt_logprobs(self, scores) -> None:
        request = scores.request
        for i, position in enumerate(scores.positions.tolist()):
            token_id = request.prompt_token_ids[position]
            request.prompt_logprobs[position] = logprobs_dict(scores.logprobs, i, token_id, self.token_texts)

    def _finish(self, request: Request) -> Optional[RequestOutput]:
        """Count a finished completion; the prompt's RequestOutput once all n have finished."""
        group = self.groups[request.group_id]
        group.num_finished += 1
        if group.num_finished < len(group.requests):
            return None
        del self.groups[request.group_id]
        return self._make_output(group)

    def _stamp_first_token(self, request: Request) -> None:
        m = request.metrics
        m.first_token_time = time.time() - m.inference_start_time

    def _make_output(self, group: RequestGroup) -> RequestOutput:
        first = group.requests[0]
        errors = [r.error for r in group.requests if r.error is not None]
        return RequestOutput(
            request_id=group.request_id,
            prompt=first.prompt,
            prompt_token_ids=list(first.prompt_token_ids),
            prompt_logprobs=first.prompt_logprobs,
            outputs=CompletionOutputs(self._completion(r) for r in group.requests),
            finished=True,
            metrics=self._metrics(group),
            num_cached_tokens=first.num_cached_tokens or 0,
            error_code=200 if not errors else 500,
            error_msg=errors[0] if errors else None,
        )

    def _completion(self, request: Request) -> CompletionOutput:
        wants_logprobs = request.logprobs is not None
        reasoning, text = None, request.detokenizer.text
        if self.reasoning_parser is not None:
            reasoning, text = self.reasoning_parser.extract(text)
        return CompletionOutput(
            index=request.index,
            send_idx=len(request.output_token_ids),
            token_ids=list(request.output_token_ids),
            text=text,
            reasoning_content=reasoning,
            finish_reason=request.finish_reason,
            stop_reason=request.stop_reason,
            cumulative_logprob=request.cumulative_logprob if wants_logprobs else None,
            logprobs=request.logprobs,
        )

    @staticmethod
    def _metrics(group: RequestGroup) -> RequestMetrics:
        """The prompt's timings: from its arrival and its earliest-started completion to now."""
        now = time.time()
        m = RequestMetrics(arrival_time=group.requests[0].metrics.arrival_time)
        starts = [r.metrics.inference_start_time for r in group.requests if r.metrics.inference_start_time is not None]
        if starts:
            m.inference_start_time = min(starts)
            m.time_in_queue = m.inference_start_time - m.arrival_time
            m.model_forward_time = now - m.inference_start_time
            firsts = [r.metrics.inference_start_time + r.metrics.first_token_time for r in group.requests
                      if r.metrics.first_token_time is not None]
            if firsts:
                m.first_token_time = min(firsts) - m.inference_start_time
        m.model_execute_time = now - m.arrival_time
        return m
