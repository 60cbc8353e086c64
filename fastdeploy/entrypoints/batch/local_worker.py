"""One `LLM` in this process serving batch requests, answering each as soon as it finishes.

Requests are fed to the engine a window at a time (a few times `max_num_seqs` queued: enough to keep
every batch slot busy, never the whole file in memory), and each finished request's record is
yielded at once, so the runner writes it before the next step (an embedding or score line with
several inputs: once all its inputs are pooled). A request the engine refuses
(prompt too long, logprobs above max_logprobs, a chat template that raises, a schema that does not
compile, a per-request guided_decoding_backend other than the LLM's, an endpoint the model does not
serve: embeddings from a generative model, text from an embedding model...) becomes an error
record; the others go on.

Tools: a chat request's tools are rendered by the chat template as `LLM.chat` renders them. The
LLM's tool_call_parser reads the calls of chat requests with tools and tool_choice absent or
"auto"; a forcing tool_choice's JSON is read back into calls (tool_parsers/tool_choice.py); every
other request keeps its text whole (no tools, "none", completions).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

from fastdeploy.engine.async_engine import UNSET
from fastdeploy.entrypoints.batch.format import (INVALID_PARAMETER, POOLING_KINDS, BatchRequest, error_record,
                                                 pooling_record, response_record)
from fastdeploy.entrypoints.openai import prepare
from fastdeploy.entrypoints.openai.protocol import UNSUPPORTED_TASK

WINDOW_PER_SEQ = 4  # requests queued per batch slot


@dataclass
class _Line:
    """One request line on the engine: its engine requests (several for an embedding or score line
    with several inputs) and the outputs that have come back."""

    request: BatchRequest
    request_ids: list[str]
    plan: object = None  # a score line's ScorePlan (prepare.prepare_pooling)
    outputs: dict = field(default_factory=dict)

    def add(self, output, model_name: str) -> Optional[dict]:
        """Take one of the line's outputs; the line's record once all have come, else None."""
        self.outputs[output.request_id] = output
        if len(self.outputs) < len(self.request_ids):
            return None
        model = self.request.model or model_name
        if self.request.kind in POOLING_KINDS:
            return pooling_record(self.request, [self.outputs[r] for r in self.request_ids], self.plan, model)
        return response_record(self.request, output, model)


class LocalWorker:
    """`LLM(**engine_kwargs)` and the model name its responses carry."""

    def __init__(self, engine_kwargs: dict):
        from fastdeploy import LLM

        self.llm = LLM(**engine_kwargs)
        model = engine_kwargs.get("model")
        self.model_name = str(model) if model is not None else "default"
        self.window = WINDOW_PER_SEQ * self.llm.llm_engine.config.scheduler_config.max_num_seqs

    def process(self, requests: Iterable[BatchRequest]) -> Iterator[dict]:
        """One output record per request (OpenAI batch output line, or an error record), in the order
        requests finish; never raises for a bad request. Closing the generator early aborts the rest."""
        engine = self.llm.llm_engine
        todo = deque(requests)
        pending: dict[str, _Line] = {}  # engine request id -> its line
        try:
            while todo or pending:
                while todo and len(pending) < self.window:
                    line, refusal = self._enqueue(todo.popleft())
                    if refusal is not None:
                        yield refusal
                    else:
                        pending.update((request_id, line) for request_id in line.request_ids)
                for output in engine.step():
                    record = pending.pop(output.request_id).add(output, self.model_name)
                    if record is not None:
                        yield record
        finally:
            for request_id in pending:
                engine.abort_request(request_id)

    def _enqueue(self, request: BatchRequest) -> tuple[Optional[_Line], Optional[dict]]:
        """(the line on the engine, None), or (None, an error record) when the engine refuses it."""
        engine = self.llm.llm_engine
        reason = prepare.task_refusal(self.llm, request.kind)
        if reason is not None:
            return None, error_record(request.custom_id, request.line, UNSUPPORTED_TASK, reason)
        if request.kind in POOLING_KINDS:
            try:
                prompts, plan = prepare.prepare_pooling(self.llm, request.pooling)
            except (ValueError, TypeError) as e:
                return None, error_record(request.custom_id, request.line, INVALID_PARAMETER, str(e))
            return _Line(request, [engine.enqueue(p) for p in prompts], plan), None
        reason = prepare.refusal(self.llm, request)
        if reason is not None:
            return None, error_record(request.custom_id, request.line, INVALID_PARAMETER, reason)
        try:
            [prepared] = prepare.make_requests(self.llm, request)
        except (ValueError, TypeError, FileNotFoundError, ConnectionError) as e:
            return None, error_record(request.custom_id, request.line, "invalid_request", str(e))
        request_id = engine.enqueue(prepared)
        reader = prepare.tool_call_reader(request)
        if reader is not UNSET:
            engine.output_processor.set_tool_call_reader(request_id, reader)
        return _Line(request, [request_id]), None

    def shutdown(self) -> None:
        self.llm.llm_engine.shutdown()
