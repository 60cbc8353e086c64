"""One `LLM` in this process serving batch requests, answering each as soon as it finishes.

Requests are fed to the engine a window at a time (a few times `max_num_seqs` queued: enough to keep
every batch slot busy, never the whole file in memory), and each finished request's record is
yielded at once, so the runner writes it before the next step. A request the engine refuses
(prompt too long, logprobs above max_logprobs, a chat template that raises, a schema that does not
compile, a per-request guided_decoding_backend other than the LLM's...) becomes an error record;
the others go on.

Tools: a chat request's tools are rendered by the chat template as `LLM.chat` renders them. The
LLM's tool_call_parser reads the calls of chat requests with tools and tool_choice absent or
"auto"; a forcing tool_choice's JSON is read back into calls (tool_parsers/tool_choice.py); every
other request keeps its text whole (no tools, "none", completions).
"""
from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator, Optional

from fastdeploy.engine.async_engine import UNSET
from fastdeploy.entrypoints.batch.format import INVALID_PARAMETER, BatchRequest, error_record, response_record
from fastdeploy.entrypoints.openai import prepare

WINDOW_PER_SEQ = 4  # requests queued per batch slot


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
        pending: dict[str, BatchRequest] = {}
        try:
            while todo or pending:
                while todo and len(pending) < self.window:
                    request = todo.popleft()
                    request_id, refusal = self._enqueue(request)
                    if refusal is not None:
                        yield refusal
                    else:
                        pending[request_id] = request
                for output in engine.step():
                    request = pending.pop(output.request_id)
                    yield response_record(request, output, request.model or self.model_name)
        finally:
            for request_id in pending:
                engine.abort_request(request_id)

    def _enqueue(self, request: BatchRequest) -> tuple[Optional[str], Optional[dict]]:
        """(engine request id, None), or (None, an error record) when the engine refuses it."""
        engine = self.llm.llm_engine
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
        return request_id, None

    def shutdown(self) -> None:
        self.llm.llm_engine.shutdown()
