"""SIGTERM / SIGINT while a stream runs: drain, finish or abort, exit 0, leave no process behind.

Each test starts its own server, opens a long greedy stream, reads a few chunks and signals the
server. While it drains, /health and new requests answer 503 (or, once uvicorn has closed its
socket, the connection is refused). With the default grace the stream runs to max_tokens
(finish_reason "length"); with `--timeout-graceful-shutdown 0` it ends at once with finish_reason
"abort", as it does on a second signal. Either way it ends with `data: [DONE]` (read from the raw
bytes) and the server exits 0. With `--tensor-parallel-size 2` the worker processes end with it.

A worker killed mid-stream kills the engine (a real step failure): the stream ends with OpenAI's
error event, /health and new requests answer 503, and SIGTERM still exits 0 leaving nothing behind.
"""
import asyncio
import os
import signal
import time
from dataclasses import dataclass

import httpx
import openai
import psutil
import pytest

from raw_recorder import Recorder, sse_events
from running_server import RunningServer

KEY = "sk-shutdown-test"
GRACE_S = 30
GONE_WITHIN_S = 15
HANG_LIMIT_S = 180  # a tensor-parallel server starts in about a quarter of this


@dataclass
class Drained:
    chunks: list  # the stream's chunks (openai objects), all of them
    events: list  # its raw SSE events
    health: object  # /health's status code while draining, or "refused"
    refused: object  # a new request's status code while draining, or "refused"
    exit_code: int
    exited_s: float  # seconds from the signal to the exit


async def status_while_draining(call) -> object:
    try:
        await call()
    except openai.APIStatusError as e:
        return e.status_code
    except (openai.APIConnectionError, httpx.ConnectError):
        return "refused"
    return 200


async def signal_mid_stream(server, signals: list, max_tokens: int, api_key: str = "none") -> Drained:
    """Open a stream of `max_tokens` (EOS ignored), read 3 chunks, send `signals` (0.3 s apart), probe
    while it drains, read the stream to its end."""
    bodies: dict = {}
    async with httpx.AsyncClient(transport=Recorder(bodies), timeout=60) as http:
        client = server.async_client(api_key=api_key, http_client=http)
        stream = await client.completions.create(
            model=server.model, prompt="Once upon a time", max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}, extra_headers={"x-job": "a"})
        chunks = stream.__aiter__()
        got = [await chunks.__anext__() for _ in range(3)]
        signalled = time.monotonic()
        for i, sig in enumerate(signals):
            await asyncio.sleep(0.3 if i else 0)
            server.process.send_signal(sig)
        health = 200
        while health == 200 and time.monotonic() - signalled < 5:  # until the signal handler has run
            health = await _health(server)
        refused = await status_while_draining(lambda: client.completions.create(
            model=server.model, prompt="Hi", max_tokens=2, extra_headers={"x-job": "b"}))
        got += [chunk async for chunk in chunks]
    exit_code = await asyncio.to_thread(server.process.wait, GRACE_S + 30)
    return Drained(got, sse_events(bytes(bodies["a"])), health, refused, exit_code, time.monotonic() - signalled)


async def _health(server) -> object:
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            return (await http.get(server.url + "/health")).status_code
    except httpx.ConnectError:
        return "refused"


def finishes(chunks) -> list:
    return [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]


def test_sigterm_lets_the_stream_in_flight_finish_and_refuses_new_requests(no_hang):
    with RunningServer("--max-model-len", "512", "--timeout-graceful-shutdown", str(GRACE_S),
                       env={"FD_API_KEY": KEY}) as server:
        with pytest.raises(openai.AuthenticationError):  # the key comes from FD_API_KEY
            server.client().models.list()
        drained = asyncio.run(signal_mid_stream(server, [signal.SIGTERM], 200, api_key=KEY))
    assert drained.health == 503 and drained.refused == 503  # the stream still runs: the socket is open
    assert finishes(drained.chunks) == ["length"] and drained.chunks[-1].usage.completion_tokens == 200
    assert drained.events[-1] == "data: [DONE]"
    assert drained.exit_code == 0 and drained.exited_s < GRACE_S


@pytest.mark.parametrize("grace, signals", [(0, [signal.SIGINT]), (GRACE_S, [signal.SIGTERM, signal.SIGTERM])],
                         ids=["sigint-no-grace", "second-sigterm"])
def test_no_grace_or_a_second_signal_aborts_the_stream_in_flight(grace, signals, no_hang):
    with RunningServer("--max-model-len", "1024", "--timeout-graceful-shutdown", str(grace)) as server:
        drained = asyncio.run(signal_mid_stream(server, signals, 1000))
    assert drained.health in (503, "refused") and drained.refused in (503, "refused")
    assert finishes(drained.chunks) == ["abort"] and drained.chunks[-1].usage.completion_tokens < 1000
    assert drained.events[-1] == "data: [DONE]"
    assert drained.exit_code == 0 and drained.exited_s < GONE_WITHIN_S


def tp_server():
    """A server on two tensor-parallel worker processes, and those workers."""
    server = RunningServer("--max-model-len", "256", "--tensor-parallel-size", "2")
    workers = [p for p in psutil.Process(server.process.pid).children(recursive=True)
               if "fastdeploy.worker.tp_worker" in p.cmdline()]
    assert len(workers) == 2
    return server, workers


def assert_nothing_left(pid: int, workers: list) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and (alive := session_members(pid)):
        time.sleep(0.1)
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)


def test_sigterm_to_a_tensor_parallel_server_leaves_no_process(no_hang):
    server, workers = tp_server()
    with server:
        drained = asyncio.run(signal_mid_stream(server, [signal.SIGTERM], 24))
    assert finishes(drained.chunks) == ["length"] and drained.events[-1] == "data: [DONE]"
    assert drained.exit_code == 0
    assert_nothing_left(server.process.pid, workers)


async def stream_until_the_engine_dies(server, worker) -> tuple[list, Exception]:
    client = server.async_client(timeout=60)
    stream = await client.completions.create(model=server.model, prompt="Once upon a time", max_tokens=200,
                                             temperature=0, stream=True, extra_body={"ignore_eos": True})
    got = []
    try:
        async for chunk in stream:
            got.append(chunk)
            if len(got) == 3:
                worker.kill()
    except openai.APIError as e:  # the openai client raises on the stream's error event
        return got, e
    raise AssertionError(f"the stream ended without an error after {len(got)} chunks")


def test_a_dead_worker_kills_the_engine_and_the_server_still_shuts_down_cleanly(no_hang):
    server, workers = tp_server()
    with server:
        got, error = asyncio.run(stream_until_the_engine_dies(server, workers[1]))
        assert all(c.choices[0].finish_reason is None for c in got)
        assert "the engine stopped" in error.message and "rank 1" in error.message
        health = httpx.get(server.url + "/health", timeout=5)
        assert health.status_code == 503 and "rank 1" in health.json()["error"]["message"]
        with pytest.raises(openai.InternalServerError) as refused:
            server.client().completions.create(model=server.model, prompt="Hi", max_tokens=2)
        assert refused.value.status_code == 503
        assert server.terminate() == 0
    assert_nothing_left(server.process.pid, workers)


def session_members(sid: int) -> list:
    """Live processes of the session the server led (it was started in a new session)."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            pass
    return out
