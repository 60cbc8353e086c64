"""A measurement prototype, not the engine's design: our API server with the engine loop in a separate
process (vLLM v1's engine-core split) instead of a thread, for benchmark_serving.py's "ours-process".

    python benchmarks/engine_process_server.py --model M --port P [the api_server's flags]

The server process keeps everything but the step loop: HTTP, JSON, chat templates, tokenization and
validation (its own LLM, whose weights are loaded but never run) and SSE chunks. The engine process
(multiprocessing, spawn) holds a second LLM and runs its engine: it receives each prepared prompt
through a pipe, steps while requests are unfinished, and sends each step's delta RequestOutputs back
(pickled). A reader thread in the server hands them to the asyncio queues, as the thread design's
loop does. Detokenization stays with the engine, as in the thread design. Only what the benchmark
uses is here: no forced tool-call readers (they do not pickle), no engine-death handling.
"""
from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastdeploy.engine import async_engine  # noqa: E402
from fastdeploy.engine.async_engine import EngineStats, _Channel, _put_all  # noqa: E402
from fastdeploy.entrypoints.openai import api_server  # noqa: E402
from fastdeploy.platforms.cpu import engine_threads  # noqa: E402


def engine_process(conn, engine_kwargs: dict) -> None:
    """The engine process: commands in, each step's [(stream id, delta)] out."""
    from fastdeploy import LLM

    engine = LLM(**engine_kwargs).llm_engine
    ids: dict[str, int] = {}  # engine request id -> stream id
    conn.send("ready")
    while True:
        while conn.poll(0 if engine.has_unfinished_requests() else None):
            command = conn.recv()
            if command[0] == "stop":
                return
            if command[0] == "add":
                _, stream_id, prepared, deltas = command
                ids[engine.enqueue(prepared, stream=deltas)] = stream_id
            else:
                request_id = next((r for r, s in ids.items() if s == command[1]), None)
                if request_id is not None:
                    del ids[request_id]
                    engine.abort_request(request_id)
        outputs = engine.step()
        sent = [(ids[o.request_id], o) for o in outputs if o.request_id in ids]
        for o in outputs:
            if o.finished:
                ids.pop(o.request_id, None)
        scheduler = engine.scheduler
        stats = EngineStats(len(scheduler.running), len(scheduler.waiting), 0.0)
        conn.send((sent, stats))


class ProcessEngine:
    """AsyncEngine's surface (generate, abort_all, shutdown, stats, dead) over an engine process."""

    def __init__(self, engine_kwargs: dict):
        # the child reads OMP_NUM_THREADS as the user's setting; here it is the 1 `import paddle` wrote
        os.environ["OMP_NUM_THREADS"] = str(engine_threads())
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=engine_process, args=(child, engine_kwargs), daemon=True)
        self.process.start()
        assert self.conn.recv() == "ready"
        self.stats, self.dead = EngineStats(), None
        self._channels: dict[int, _Channel] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def start(self) -> None:
        pass

    def _send(self, command) -> None:
        with self._send_lock:
            self.conn.send(command)

    def _read(self) -> None:
        while True:
            try:
                sent, self.stats = self.conn.recv()
            except (EOFError, OSError):
                return
            by_loop: dict = {}
            for stream_id, output in sent:
                channel = self._channels.get(stream_id)
                if channel is None:
                    continue
                if output.finished:
                    del self._channels[stream_id]
                by_loop.setdefault(channel.loop, []).append((channel.queue, output))
            for loop, pairs in by_loop.items():
                loop.call_soon_threadsafe(_put_all, pairs)

    async def generate(self, prepared, tool_call_reader=None, stream: bool = True):
        stream_id = next(self._ids)
        channel = _Channel(asyncio.get_running_loop())
        self._channels[stream_id] = channel
        self._send(("add", stream_id, prepared, stream))
        finished = False
        try:
            while not finished:
                output = await channel.queue.get()
                finished = output.finished
                yield output
        finally:
            if not finished:
                self._channels.pop(stream_id, None)
                self._send(("abort", stream_id))

    def abort_all(self) -> None:
        for stream_id in list(self._channels):
            self._send(("abort", stream_id))

    def shutdown(self) -> None:
        if self.process.is_alive():
            self._send(("stop",))
            self.process.join(30)


def main() -> int:
    engine_kwargs = api_server.cli_engine_kwargs(api_server.parse_args(sys.argv[1:]))
    # api_server.build_state wraps its LLM's engine in async_engine.AsyncEngine: an engine process instead
    async_engine.AsyncEngine = lambda _engine: ProcessEngine(engine_kwargs)
    return api_server.main()


if __name__ == "__main__":
    sys.exit(main())
