"""AsyncEngine: an LLMEngine's step loop on its own thread, for asyncio callers (the API server).

    engine = AsyncEngine(llm.llm_engine)           # the LLM's engine: one engine, not two
    engine.start()
    prepared = await asyncio.to_thread(llm.llm_engine.make_request, text, None, params)
    async for delta in engine.generate(prepared):  # delta RequestOutputs (output/stream_delta.py)
        ...
    engine.shutdown()

Prompts of a pooling model (`make_pooling_request`) run the same way: `generate` yields their one
PoolingRequestOutput, and many of them are packed into each step.

The loop thread owns the engine: it alone calls `enqueue`, `step` and `abort_request`. Callers
hand it requests and aborts through a queue, and it picks them up between steps, so requests join
and leave the running batch at every step. While nothing is queued it sleeps until a request
arrives. `make_request` (tokenization, chat templates, grammar compilation) runs on the caller's
side, outside the loop, so it never delays a step; the engine's parts it touches (the input
processor, the structured-output manager's compile cache) are safe for that.

Each step's deltas reach their asyncio queues in one call into the event loop. A caller that stops
reading (a client that disconnected) aborts its request: the loop drops it at the next step and its
KV blocks return to the pool. A step that raises kills the engine: every open stream gets the
error, `dead` holds it, and later `generate` calls raise EngineDeadError at once.

Why a thread and not a separate engine process: see docs/serving.md ("Engine loop").
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional

from fastdeploy.engine.request import RequestOutput

logger = logging.getLogger("fastdeploy")

UNSET = object()  # keep the output processor's tool-call reading as configured


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (a step failed, or it was shut down); no request can run."""


@dataclass
class EngineStats:
    """The engine's state after its latest step, for /metrics (read from other threads)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of the usable KV blocks that requests hold (cached free ones excluded)


@dataclass(eq=False)
class _Channel:
    """One request's way back: its queue on the caller's event loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    request_id: Optional[str] = None  # set by the loop thread when it enqueues the request


class AsyncEngine:
    """Runs `engine` (an LLMEngine) continuously on a daemon thread."""

    def __init__(self, engine):
        self.engine = engine
        self.stats = EngineStats()
        self.dead: Optional[BaseException] = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Channel] = {}  # by request id; the loop thread's alone
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="fastdeploy-engine-loop", daemon=True)

    # ---- caller side (any thread / event loop) ---------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    async def generate(self, prepared, tool_call_reader=UNSET, stream: bool = True) -> AsyncIterator[RequestOutput]:
        """Queue a prompt made by `engine.make_request` and yield its delta RequestOutputs as the
        loop produces them, the last with finished=True (stream=False: only one, the whole output
        once every completion has finished). A pooling prompt (`engine.make_pooling_request`)
        yields one PoolingRequestOutput, from the step that computed it. Leaving the loop early
        (break, an exception, a cancelled task) aborts the request. `tool_call_reader`: as
        OutputProcessor.set_tool_call_reader (None: no tool calls are read); UNSET keeps the
        engine's tool parser. Raises EngineDeadError when the engine has stopped, or when
        `abort_all` aborted a pooling prompt (it has no partial output to end with)."""
        self._check_alive()
        channel = _Channel(asyncio.get_running_loop())
        self._send(("add", prepared, channel, tool_call_reader, stream))
        finished = False
        try:
            while not finished:
                item = await channel.queue.get()
                if isinstance(item, EngineDeadError):
                    raise item
                if isinstance(item, BaseException):
                    raise EngineDeadError(f"the engine stopped: {type(item).__name__}: {item}") from item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self._send(("abort", channel))

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop (queued and running requests are aborted: their streams end with
        finish_reason "abort") and shut the engine down; idempotent."""
        if not self._stopping:
            self._stopping = True
            self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self.engine is not None:
            engine, self.engine = self.engine, None
            engine.shutdown()

    def abort_all(self) -> None:
        """Abort every queued and running request (their streams end with finish_reason "abort";
        a pooling prompt's `generate` raises EngineDeadError)."""
        self._send(("abort_all",))

    def _check_alive(self) -> None:
        if self.dead is not None:
            raise EngineDeadError(f"the engine stopped: {type(self.dead).__name__}: {self.dead}")
        if self._stopping or self.engine is None:
            raise EngineDeadError("the engine is shutting down")

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    # ---- the loop thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                self._apply_commands()
                if not self.engine.has_unfinished_requests():
                    self._update_stats()
                    self._wake.wait()
                    self._wake.clear()
                    continue
                outputs = self.engine.step()
                self._update_stats()
                self._deliver(outputs)
        except BaseException as e:  # noqa: BLE001 - a dead engine must reach every waiting stream
            logger.exception("the engine loop stopped")
            self.dead = e
            self._fail_all(e)
            return
        self._apply_commands()
        self._abort_all()

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            kind = command[0]
            if kind == "add":
                self._add(*command[1:])
            elif kind == "abort":
                stream = command[1]
                if stream.request_id is not None and self._streams.pop(stream.request_id, None) is not None:
                    self.engine.abort_request(stream.request_id)
            else:
                self._abort_all()

    def _add(self, prepared, stream: _Channel, tool_call_reader, deltas: bool) -> None:
        if self._stopping:
            self._post([(stream, EngineDeadError("the engine is shutting down"))])
            return
        request_id = self.engine.enqueue(prepared, stream=deltas)
        if tool_call_reader is not UNSET:
            self.engine.output_processor.set_tool_call_reader(request_id, tool_call_reader)
        stream.request_id = request_id
        self._streams[request_id] = stream

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        items = []
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            if output.finished:
                del self._streams[output.request_id]
            items.append((stream, output))
        self._post(items)

    def _abort_all(self) -> None:
        items = []
        for request_id, stream in list(self._streams.items()):
            output = self.engine.abort_request(request_id)  # None for a pooling prompt: it has no partial output
            items.append((stream, output if output is not None else EngineDeadError("the request was aborted")))
        self._streams.clear()
        self._post(items)

    def _fail_all(self, error: BaseException) -> None:
        self._post([(stream, error) for stream in self._streams.values()])
        self._streams.clear()
        while True:  # requests that never reached the engine
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command[0] == "add":
                self._post([(command[2], error)])

    @staticmethod
    def _post(items: list) -> None:
        """Hand each (stream, item) to its event loop: one call per loop for the whole list."""
        by_loop: dict = {}
        for stream, item in items:
            by_loop.setdefault(stream.loop, []).append((stream.queue, item))
        for loop, pairs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, pairs)
            except RuntimeError:  # that event loop has closed: nobody is reading
                pass

    def _update_stats(self) -> None:
        scheduler, pool = self.engine.scheduler, self.engine.block_pool
        self.stats = EngineStats(
            num_running=len(scheduler.running), num_waiting=len(scheduler.waiting),
            kv_cache_usage=1.0 - pool.num_free_blocks / max(pool.num_usable_blocks, 1))


def _put_all(pairs: list) -> None:
    for q, item in pairs:
        q.put_nowait(item)

