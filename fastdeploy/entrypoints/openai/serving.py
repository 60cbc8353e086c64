"""The endpoints: a parsed OpenAI request -> the engine loop -> a response body or an SSE stream.

Both endpoints share one path: the request's prompts are prepared off the event loop (chat template,
tokenization, grammar compilation: prepare.py), each runs on the AsyncEngine, and the results become
OpenAI's bodies or chunks (responses.py). A prompt list of /v1/completions runs as one engine
request per prompt, all at once; choice i * n + j is prompt i's completion j.

Embeddings and scores (`prepare_pooling`, `pool`) take the same path without streams: each input
(a score request's pairs, or its distinct texts for an embedding model) is one engine request, all
at once, and the body is built when all have been pooled.

Streams: `data: {chunk}\\n\\n` per chunk, then `data: [DONE]\\n\\n`. An engine that dies mid-stream
ends the stream with one `data: {"error": {...}}` event before [DONE]. A client that goes away
cancels the response, which aborts its engine requests (their KV blocks are freed at the next step).
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

from fastdeploy.engine.async_engine import AsyncEngine, EngineDeadError
from fastdeploy.entrypoints.openai import prepare, responses
from fastdeploy.entrypoints.openai.metrics import ServerMetrics
from fastdeploy.entrypoints.openai.protocol import (EMBEDDING_KEYS, INVALID_PARAMETER, SCORE_KEYS, UNSUPPORTED_TASK,
                                                    OpenAIError, OpenAIRequest, PoolingRequest)

logger = logging.getLogger("fastdeploy")


class OpenAIServing:
    """What the endpoints run on: the LLM (templates, tokenizer, validation), its engine loop, metrics."""

    def __init__(self, llm, engine: AsyncEngine, metrics: ServerMetrics):
        self.llm, self.engine, self.metrics = llm, engine, metrics

    async def prepare(self, request: OpenAIRequest) -> list:
        """The request's prepared prompts, made on a worker thread; OpenAIError 400 for bad input."""
        self.check_task(request.kind)
        try:
            return await asyncio.to_thread(prepare.prepare, self.llm, request)
        except (ValueError, TypeError, FileNotFoundError, ConnectionError) as e:
            raise OpenAIError(400, str(e), code="invalid_parameter") from e

    def check_task(self, kind: str) -> None:
        """OpenAIError 400 (code unsupported_task) when the model cannot answer a `kind` request."""
        reason = prepare.task_refusal(self.llm, kind)
        if reason is not None:
            raise OpenAIError(400, reason, code=UNSUPPORTED_TASK)

    async def prepare_pooling(self, request: PoolingRequest) -> tuple[list, object]:
        """prepare.prepare_pooling on a worker thread; OpenAIError 400 naming the body key for bad input."""
        self.check_task(request.kind)
        try:
            return await asyncio.to_thread(prepare.prepare_pooling, self.llm, request)
        except (ValueError, TypeError) as e:
            raise OpenAIError(400, str(e), param=_pooling_param(str(e), request.kind), code=INVALID_PARAMETER) from e

    async def pool(self, request: PoolingRequest, prepared: tuple[list, object]) -> dict:
        """The embedding or score body once every prompt of the request has been pooled: each prompt is
        its own engine request, so the prompts of many requests share steps."""
        prompts, plan = prepared
        outputs = await asyncio.gather(*(self._pooled(p) for p in prompts))
        return responses.pooling_body(request, outputs, plan)

    async def _pooled(self, prepared):
        output = None
        try:
            async for output in self.engine.generate(prepared, stream=False):
                pass
        except EngineDeadError as e:
            raise OpenAIError(500, str(e), type="internal_server_error", code="engine_dead") from e
        self.metrics.observe_pooling(output)
        return output

    async def complete(self, request: OpenAIRequest, prepared: list) -> dict:
        """The whole response body once every completion has finished; OpenAIError (500) when one
        failed at run time (responses.py)."""
        reader = prepare.tool_call_reader(request)
        outputs = await asyncio.gather(*(self._final(p, reader) for p in prepared))
        params = request.sampling_params
        if request.kind == "chat":
            return responses.chat_completion_body(outputs[0], params, request.model)
        return responses.completion_body(outputs, params, request.model)

    async def _final(self, prepared, reader):
        output = None
        async for output in self.engine.generate(prepared, reader, stream=False):
            pass
        self.metrics.observe(output, [(c.send_idx, c.finish_reason or "abort") for c in output.outputs])
        return output

    async def stream(self, request: OpenAIRequest, prepared: list) -> AsyncIterator[str]:
        """The SSE events of a streamed response, ending with [DONE]."""
        chunks = responses.ChatStream(request) if request.kind == "chat" else responses.CompletionStream(request)
        finished: dict[int, list] = {i: [] for i in range(len(prepared))}
        try:
            async for index, delta in self._deltas(request, prepared):
                for c in delta.outputs:
                    if c.finish_reason is not None:
                        finished[index].append((c.send_idx, c.finish_reason))
                if delta.finished:
                    self.metrics.observe(delta, finished[index])
                for chunk in chunks.feed(delta, index):
                    yield responses.sse(chunk)
            for chunk in chunks.finish():
                yield responses.sse(chunk)
        except EngineDeadError as e:
            yield responses.sse(OpenAIError(500, str(e), type="internal_server_error", code="engine_dead").body())
        yield responses.SSE_DONE

    async def _deltas(self, request: OpenAIRequest, prepared: list) -> AsyncIterator[tuple[int, object]]:
        """(prompt index, delta RequestOutput) of every prompt, in the order they come."""
        reader = prepare.tool_call_reader(request)
        if len(prepared) == 1:
            async for delta in self.engine.generate(prepared[0], reader):
                yield 0, delta
            return
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, p) -> None:
            try:
                async for delta in self.engine.generate(p, reader):
                    await merged.put((index, delta))
            except BaseException as e:  # noqa: BLE001 - handed to the reader, which raises it
                await merged.put((index, e))
                return
            await merged.put((index, None))

        tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(prepared)]
        try:
            open_prompts = len(tasks)
            while open_prompts:
                index, item = await merged.get()
                if item is None:
                    open_prompts -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield index, item
        finally:
            for task in tasks:  # a client that left: every prompt's request is aborted
                task.cancel()


def _pooling_param(message: str, kind: str):
    """The body key an LLM.embed / LLM.score message is about: a key among its first words ("dimensions=8:
    ...", "prompt 0: truncate_prompt_tokens=..."), else the inputs for a message about a prompt."""
    words = message.replace("=", " ").replace(":", " ").split()
    for word in words[:3]:
        if word in (EMBEDDING_KEYS if kind == "embedding" else SCORE_KEYS):
            return word
    return "input" if kind == "embedding" and words[:1] == ["prompt"] else None
