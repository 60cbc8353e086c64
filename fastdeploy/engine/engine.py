"""LLMEngine: add_request / step / abort. Owns the scheduler, the model runner and the tokenizer.

One `step()` = schedule -> run the model on the scheduled tokens -> append sampled tokens,
detokenize, check stops -> free finished requests' blocks -> RequestOutputs of finished requests.
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
from fastdeploy.engine.request import CompletionOutput, Request, RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.sched.scheduler import Scheduler
from fastdeploy.output.detokenizer import IncrementalDetokenizer
from fastdeploy.output.output_processor import append_token
from fastdeploy.platforms.cpu import set_paddle_threads
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
            sc.max_num_batched_tokens, sc.enable_chunked_prefill,
        )
        self.runner = ModelRunner(fd_config, model, np.random.default_rng(fd_config.seed))
        self.requests: dict[str, Request] = {}
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
        model = model_cls(config.model_config, config.cache_config.block_size, config.scheduler_config.max_model_len)
        model.load_weights(source.weights())
        logger.info("loaded %s in %.1f s on %d threads", path, time.perf_counter() - start, threads)
        return cls(config, source.tokenizer, model)

    # ---- requests ---------------------------------------------------------------------------
    def resolve_sampling_params(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        """A copy with the model's defaults filled in and max_tokens clamped to the context."""
        gen = self.config.generation_config
        room = self.config.scheduler_config.max_model_len - prompt_len
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        temperature = params.temperature if params.temperature is not None else gen.get("temperature", 1.0)
        top_p = params.top_p if params.top_p is not None else gen.get("top_p", 1.0)
        top_k = params.top_k if params.top_k is not None else gen.get("top_k", 0)
        return params.clone(
            max_tokens=max_tokens,
            min_tokens=min(params.min_tokens, max_tokens),
            temperature=float(temperature),
            top_p=float(top_p),
            top_k=max(int(top_k), 0),
        )

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
                     index: Optional[int] = None) -> Request:
        """A validated Request with its own resolved SamplingParams, not yet queued.

        Raises ValueError/TypeError (naming prompt `index` when given) before anything is queued.
        """
        self.validate_prompt(prompt_token_ids, index)
        resolved = self.resolve_sampling_params(params, len(prompt_token_ids))
        request = Request(
            request_id=str(self._next_id),
            prompt=prompt,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=resolved,
            eos_token_ids=self.eos_token_ids,
            max_tokens=resolved.max_tokens,
        )
        self._next_id += 1
        request.detokenizer = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids,
                                                     resolved.skip_special_tokens)
        return request

    def enqueue(self, request: Request) -> str:
        """Queue a request made by make_request; returns its request_id."""
        self.requests[request.request_id] = request
        self.scheduler.add_request(request)
        return request.request_id

    def add_request(self, prompt: Optional[str], prompt_token_ids: list[int], params: SamplingParams) -> str:
        """Validate and queue one request; returns its request_id."""
        return self.enqueue(self.make_request(prompt, prompt_token_ids, params))

    def abort_request(self, request_id: str) -> Optional[RequestOutput]:
        """Stop a request now; its blocks return to the pool. Returns its output (finish_reason "abort")."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        request.finish_reason = "abort"
        self.scheduler.finish(request)
        return self._make_output(request)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one model step; returns the outputs of requests that finished in it."""
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        now = time.time()
        for s in out.scheduled:
            if s.request.metrics.inference_start_time is None:
                s.request.metrics.inference_start_time = now
        sampled = self.runner.execute(out.scheduled)
        for s in out.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
        finished = []
        for request, token in sampled:
            try:
                done = append_token(request, token)
            except Exception as e:  # this request fails alone; the rest of the batch goes on
                logger.exception("request %s failed while processing its output", request.request_id)
                request.finish_reason, request.error = "abort", f"{type(e).__name__}: {e}"
                done = True
            if done:
                self.scheduler.finish(request)
                del self.requests[request.request_id]
                finished.append(self._make_output(request))
            elif len(request.output_token_ids) == 1:
                self._stamp_first_token(request)
        return finished

    def _stamp_first_token(self, request: Request) -> None:
        m = request.metrics
        m.first_token_time = time.time() - m.inference_start_time

    def _make_output(self, request: Request) -> RequestOutput:
        m = request.metrics
        now = time.time()
        if m.first_token_time is None and request.output_token_ids:
            m.first_token_time = now - m.inference_start_time
        if m.inference_start_time is not None:
            m.time_in_queue = m.inference_start_time - m.arrival_time
            m.model_forward_time = now - m.inference_start_time
        m.model_execute_time = now - m.arrival_time
        completion = CompletionOutput(
            index=0,
            send_idx=len(request.output_token_ids),
            token_ids=list(request.output_token_ids),
            text=request.detokenizer.text,
            finish_reason=request.finish_reason,
            stop_reason=request.stop_reason,
        )
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            outputs=completion,
            finished=True,
            metrics=m,
            error_code=200 if request.error is None else 500,
            error_msg=request.error,
        )
