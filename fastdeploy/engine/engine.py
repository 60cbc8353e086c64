"""LLMEngine: add_request / step / abort. Orchestrates; the work is done by the parts it owns.

    input processor (input/)    prompt + SamplingParams -> validated, resolved PreparedPrompt
    scheduler (engine/sched/)   Requests -> SchedulerOutput (ids, token counts, block ids), asking
                                the KV cache manager (cache_manager/) for blocks and prefix hits
    executor (executor/)        SchedulerOutput -> ModelRunnerOutput (sampled tokens, logprobs)
    output processor (output/)  tokens -> text, stops, logprob dicts, RequestOutputs
    structured outputs          constraints compiled when a request is added; each step's token
      (structured_output/)      masks filled while the forward runs; sampled tokens advance them

Steps may run on any thread (the API server steps on its own): the first step on a thread gives that
thread the engine's compute threads (`set_paddle_threads`), because OpenMP keeps the count per
calling thread and a new thread would compute on one core.

One `step()` = schedule -> execute -> the scheduler applies the result (`update_from_output`) ->
the output processor detokenizes and checks stops -> finished completions leave the scheduler
(their blocks are freed) -> RequestOutputs of prompts whose completions have all finished. A step
that raises (an exception or Ctrl-C inside the model) is rolled back in the scheduler first.

With pipeline stages (`executor.max_concurrent_batches` > 1) one `step()` submits steps until that
many are in flight (vLLM v1's batch queue: stage 1 computes step i while stage 2 computes step i - 1)
or nothing more can be scheduled (the scheduler never schedules a request that is in flight), then
waits for the oldest and applies its result as above. An exception or Ctrl-C while waiting drops the
steps in flight (`Scheduler.drop_in_flight`).

A prompt with `n` completions is n Requests (vLLM's parallel sampling): each is scheduled, sampled
and finished on its own; seeded ones draw from (seed, index, step).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Optional

from fastdeploy.cache_manager.block_pool import BlockPool
from fastdeploy.cache_manager.kv_cache_manager import KVCacheManager
from fastdeploy.config import FDConfig
from fastdeploy.engine.args_utils import EngineArgs
from fastdeploy.engine.draft_setup import resolve_draft_model
from fastdeploy.engine.pooling_params import PoolingParams
from fastdeploy.engine.request import Request, RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.sched.output import SchedulerOutput
from fastdeploy.engine.sched.scheduler import Scheduler
from fastdeploy.executor import Executor, InProcessExecutor, MultiprocExecutor
from fastdeploy.input.input_processor import PreparedPrompt
from fastdeploy.input.processors import make_input_processor
from fastdeploy.output.output_processor import OutputProcessor
from fastdeploy.platforms.cpu import reuse_freed_memory, set_paddle_threads
from fastdeploy.reasoning import get_reasoning_parser
from fastdeploy.structured_output import StructuredOutputManager
from fastdeploy.tool_parsers import get_tool_parser

logger = logging.getLogger("fastdeploy")


class LLMEngine:
    def __init__(self, fd_config: FDConfig, tokenizer, executor: Executor):
        self.config = fd_config
        self.tokenizer = tokenizer
        self.input_processor = make_input_processor(fd_config, tokenizer)
        sc, cc = fd_config.scheduler_config, fd_config.cache_config
        self.block_pool = BlockPool(cc.num_blocks)
        self.kv_cache_manager = KVCacheManager(self.block_pool, cc.block_size, sc.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv_cache_manager, sc.max_num_seqs, sc.max_num_batched_tokens,
                                   sc.enable_chunked_prefill, sc.long_prefill_token_threshold,
                                   fd_config.speculative_config, executor.max_concurrent_batches)
        self.executor = executor
        parser = get_reasoning_parser(fd_config.reasoning_parser) if fd_config.reasoning_parser else None
        tool_parser = get_tool_parser(fd_config.tool_call_parser) if fd_config.tool_call_parser else None
        self.output_processor = OutputProcessor(tokenizer, parser, tool_parser)
        self.structured_output = StructuredOutputManager(
            fd_config.guided_decoding_backend, tokenizer, fd_config.model_config.vocab_size, self.eos_token_ids,
            fd_config.guided_decoding_disable_any_whitespace, reasoning=parser is not None)
        self._next_id = 0
        self._thread = threading.local()  # .threads: this thread's compute threads, once set
        self._in_flight: deque[SchedulerOutput] = deque()  # submitted steps, oldest first (pipeline stages)

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> "LLMEngine":
        from fastdeploy.cache_manager import kv_cache_sizing
        from fastdeploy.engine.pooling_setup import classifier_token_ids
        from fastdeploy.input.processors import complete_hf_config
        from fastdeploy.input.tokenizer import load_tokenizer
        from fastdeploy.model_executor.layers.quantization.weight_format import gguf_held_bytes, resolve_weight_format
        from fastdeploy.model_executor.model_loader import open_model

        threads = set_paddle_threads()
        reuse_freed_memory()
        start = time.perf_counter()
        path, source = open_model(args.model)
        tokenizer = load_tokenizer(source, args.tokenizer)
        hf_config = complete_hf_config({**source.hf_config, **(args.hf_overrides or {})}, tokenizer)
        hf_config = classifier_token_ids(hf_config, tokenizer)  # the Qwen3-Reranker form's yes/no ids
        weight_format = resolve_weight_format(args.dtype, args.quantization, hf_config, source.quant_config)
        config = args.create_engine_config(path, hf_config, source.generation_config)
        weights_bytes = (gguf_held_bytes(source.gguf_file) if weight_format.name == "gguf" else
                         config.model_config.weight_bytes(weight_format.bytes_per_weight,
                                                          weight_format.lm_head_bytes_per_weight))
        spec = config.speculative_config
        if spec is not None and spec.method == "draft_model":
            spec.draft = resolve_draft_model(config, tokenizer, args.dtype, args.quantization)
            weights_bytes += spec.draft.weights_bytes
        config.cache_config = kv_cache_sizing.size_kv_cache(config, weights_bytes, weight_format.kv_cache_dtype)
        if config.world_size > 1:  # the workers open the checkpoint and load their shards
            executor = MultiprocExecutor(config, source.quant_config, weight_format.quant_config)
        else:
            executor = InProcessExecutor(config, source.weights(), weight_format.quant_config)
        logger.info("loaded %s (weights: %s, KV cache: %s) in %.1f s on %d threads", path, weight_format.name,
                    config.cache_config.dtype, time.perf_counter() - start, threads)
        return cls(config, tokenizer, executor)

    @property
    def eos_token_ids(self) -> frozenset:
        return self.input_processor.eos_token_ids

    # ---- requests ---------------------------------------------------------------------------
    def make_request(self, prompt: Optional[str], prompt_token_ids: list[int], params: SamplingParams,
                     index: Optional[int] = None, mm_data=None) -> PreparedPrompt:
        """Validate one prompt (not yet queued), with its images/videos (input/vl_processor.py
        MultiModalData) if any. Raises ValueError/TypeError naming prompt `index`; a guided_decoding
        constraint is compiled here (a fault in it is a ValueError)."""
        prepared = self.input_processor.process(prompt, prompt_token_ids, params, index, mm_data)
        self.structured_output.validate(prepared.sampling_params, index)
        return prepared

    def make_pooling_request(self, prompt: Optional[str], prompt_token_ids: Optional[list[int]], params: PoolingParams,
                             index: Optional[int] = None, text_pair: Optional[str] = None) -> PreparedPrompt:
        """Validate one prompt of a pooling model (not yet queued); `params` already for its task
        (PoolingParams.for_task). ValueError naming prompt `index` (input_processor.process_pooling)."""
        return self.input_processor.process_pooling(prompt, prompt_token_ids, params, index, text_pair)

    def enqueue(self, prepared: PreparedPrompt, stream: bool = False) -> str:
        """Queue a prompt made by make_request as its `n` requests; returns the prompt's request_id.
        `stream`: `step()` returns a delta RequestOutput for it every step it advances
        (output/stream_delta.py), the last with finished=True, instead of one at the end."""
        group_id = str(self._next_id)
        self._next_id += 1
        if prepared.pooling_params is not None:  # one request, pooled in the step that computes its prompt
            self.output_processor.add_pooling_prompt(group_id, prepared)
            self.scheduler.add_request(Request(
                request_id=group_id, prompt_token_ids=prepared.prompt_token_ids, sampling_params=None,
                positions=prepared.positions, token_type_ids=prepared.token_type_ids,
                pooling_params=prepared.pooling_params))
            return group_id
        params = prepared.sampling_params
        request_ids = [group_id] if params.n == 1 else [f"{group_id}-{i}" for i in range(params.n)]
        self.output_processor.add_prompt(group_id, request_ids, prepared, self.eos_token_ids, stream)
        self.structured_output.add_requests(request_ids, params, prepared.prompt_token_ids)
        for i, request_id in enumerate(request_ids):
            self.scheduler.add_request(Request(
                request_id=request_id, prompt_token_ids=prepared.prompt_token_ids, sampling_params=params,
                positions=prepared.positions, eos_token_ids=self.eos_token_ids, index=i,
                bad_words_token_ids=prepared.bad_words_token_ids, token_type_ids=prepared.token_type_ids,
                mm_features=prepared.mm_features,
            ))
        return group_id

    def add_request(self, prompt: Optional[str], prompt_token_ids: list[int], params: SamplingParams) -> str:
        """Validate and queue one prompt (its `n` completions); returns its request_id."""
        return self.enqueue(self.make_request(prompt, prompt_token_ids, params))

    def abort_request(self, request_id: str) -> Optional[RequestOutput]:
        """Stop a prompt's unfinished completions now; their blocks return to the pool.
        Returns its output (finish_reason "abort" on the aborted completions), or None if unknown."""
        aborted, output = self.output_processor.abort(request_id)
        self.finish_requests(aborted)
        return output

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; later requests start with no prefix-cache hit. Returns True."""
        return self.kv_cache_manager.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one model step; returns the outputs of prompts whose completions all finished in it, and
        the deltas of streamed prompts that advanced in it."""
        if getattr(self._thread, "threads", None) is None:  # OpenMP's thread count is per calling thread
            self._thread.threads = set_paddle_threads()
        if self.executor.max_concurrent_batches > 1:
            return self._step_pipelined()
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            return []
        self._prepare_step(scheduler_output)
        try:
            runner_output = self.executor.execute_model(scheduler_output)
        except BaseException:
            self.scheduler.rollback()  # nothing this step promised was computed
            raise
        return self._apply(scheduler_output, runner_output)

    def _step_pipelined(self) -> list[RequestOutput]:
        """Submit steps until `max_concurrent_batches` are in flight or none can be scheduled, then
        apply the oldest one's result."""
        try:
            while len(self._in_flight) < self.executor.max_concurrent_batches:
                scheduler_output = self.scheduler.schedule()
                if scheduler_output.is_empty:
                    break
                self._prepare_step(scheduler_output)
                self.executor.submit(scheduler_output)
                self._in_flight.append(scheduler_output)
            if not self._in_flight:
                return []
            runner_output = self.executor.collect()
        except BaseException:
            self._in_flight.clear()
            self.executor.drop_in_flight()
            self.scheduler.drop_in_flight()
            raise
        return self._apply(self._in_flight.popleft(), runner_output)

    def _prepare_step(self, scheduler_output: SchedulerOutput) -> None:
        """Before the step is handed over: its grammar masks start filling, new requests are timed."""
        if self.structured_output.requests:  # their masks fill while the forward runs
            sampling = self.scheduler.sampling_req_ids(scheduler_output)
            scheduler_output.grammar_bitmask = self.structured_output.grammar_bitmask(
                sampling, scheduler_output.scheduled_spec_decode_tokens)
        now = time.time()
        for new in scheduler_output.scheduled_new_reqs:
            request = self.scheduler.requests[new.req_id]
            self.output_processor.on_scheduled(new.req_id, now, request.num_cached_tokens)

    def _apply(self, scheduler_output: SchedulerOutput, runner_output) -> list[RequestOutput]:
        """A step's result through the scheduler, the grammars and the output processor; the outputs."""
        self.scheduler.update_from_output(scheduler_output, runner_output)
        rejected = self.structured_output.accept_tokens(runner_output.sampled_token_ids)
        finished_ids, outputs = self.output_processor.process(runner_output, rejected)
        self.finish_requests(finished_ids)
        return outputs

    def finish_requests(self, req_ids: list[str]) -> None:
        """Finished or aborted completions (request ids) leave the scheduler (their blocks are freed)
        and the structured-output manager (their matchers); unknown ids are ignored."""
        self.scheduler.finish_requests(req_ids)
        self.structured_output.remove(req_ids)

    def shutdown(self) -> None:
        """Abort what is still queued (its blocks return to the pool) and release the executor (the
        model and its KV cache); idempotent."""
        for group_id in list(self.output_processor.groups):
            self.abort_request(group_id)
        self.structured_output.shutdown()
        self.executor.shutdown()
