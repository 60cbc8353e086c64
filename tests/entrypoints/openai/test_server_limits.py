"""API keys and the concurrency limit of a real server (`--api-key K --max-concurrency 2`).

- /v1/* with a wrong key (openai.AuthenticationError), or without one, is 401 with OpenAI's
  error body; the right key works; /health and /version need none. (FD_API_KEY, the other way to
  give the key, is used by test_server_shutdown.py's server.)
- A third request while two run is 429 (openai.RateLimitError, no retries); once the two have
  finished two requests run at once again, also after many clients that left at any moment.
"""
import asyncio
import random
import time

import httpx
import openai
import pytest

from running_server import RunningServer

KEY = "sk-limits-test"
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def server():
    with RunningServer("--max-model-len", "512", "--api-key", KEY, "--max-concurrency", "2") as s:
        yield s


def error_of(e: openai.APIStatusError) -> dict:
    body = e.response.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    return body["error"]


def test_v1_with_a_wrong_key_is_401(server):
    client = server.client(api_key="sk-wrong")
    calls = [lambda: client.models.list(),
             lambda: client.completions.create(model=server.model, prompt="Hi", max_tokens=2),
             lambda: client.chat.completions.create(model=server.model, max_tokens=2,
                                                    messages=[{"role": "user", "content": "Hi"}])]
    for call in calls:
        with pytest.raises(openai.AuthenticationError) as caught:
            call()
        assert caught.value.status_code == 401
        assert error_of(caught.value)["type"] == "authentication_error"


def test_v1_without_a_key_is_401(server):
    # the openai client always sends a key: a plain HTTP client sends none
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")]:
        response = httpx.request(method, server.url + path, json={"model": server.model, "prompt": "Hi"}, timeout=5)
        assert response.status_code == 401
        assert set(response.json()["error"]) == ERROR_KEYS and response.json()["error"]["code"] == "invalid_api_key"


def test_the_right_key_works_and_health_needs_none(server):
    client = server.client(api_key=KEY)
    assert [m.id for m in client.models.list().data] == [server.model]
    reply = client.completions.create(model=server.model, prompt="Hi", max_tokens=2, temperature=0)
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    assert httpx.get(server.url + "/version", timeout=5).status_code == 200


async def two_streams_and_a_third(server) -> tuple[list, object, list]:
    """Two streams in flight (one chunk read), then a third request; then the two read to the end."""
    client = server.async_client(api_key=KEY)
    streams = [await client.completions.create(model=server.model, prompt=f"Story {i}:", max_tokens=12,
                                               temperature=0, stream=True, extra_body={"ignore_eos": True})
               for i in range(2)]
    iters = [s.__aiter__() for s in streams]
    for it in iters:
        await it.__anext__()
    try:
        await client.chat.completions.create(model=server.model, max_tokens=2,
                                             messages=[{"role": "user", "content": "Hi"}])
        third = None
    except openai.RateLimitError as e:
        third = e
    finishes = [[c.finish_reason async for chunk in it for c in chunk.choices if c.finish_reason] for it in iters]
    return finishes, third, await two_at_once(server)


async def two_at_once(server, within_s: float = 3.0) -> list:
    """The finish reasons of two requests run at once, retried on 429 for up to `within_s` (the
    server may notice a client that left a moment after it left)."""
    client = server.async_client(api_key=KEY)
    end = time.monotonic() + within_s
    while True:
        try:
            replies = await asyncio.gather(*(client.completions.create(model=server.model, prompt="Hi", max_tokens=8,
                                                                       temperature=0) for _ in range(2)))
            return [r.choices[0].finish_reason for r in replies]
        except openai.RateLimitError:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.1)


def test_a_third_concurrent_request_is_429_until_the_first_two_finish(server, no_hang):
    finishes, third, after = asyncio.run(two_streams_and_a_third(server))
    assert finishes == [["length"], ["length"]]
    assert isinstance(third, openai.RateLimitError) and third.status_code == 429
    assert error_of(third)["type"] == "rate_limit_error"
    assert all(f in ("length", "stop") for f in after)


def test_clients_that_leave_at_any_moment_free_their_place(server, no_hang):
    body = {"model": server.model, "prompt": "Once upon a time " * 40, "max_tokens": 40, "stream": True}
    rng = random.Random(0)

    async def leave_early(stream: bool, after_s: float) -> None:
        timeout = httpx.Timeout(10, read=after_s)
        async with httpx.AsyncClient(timeout=timeout, headers={"Authorization": f"Bearer {KEY}"}) as http:
            try:
                async with http.stream("POST", server.url + "/v1/completions", json={**body, "stream": stream}) as r:
                    async for _ in r.aiter_bytes():
                        pass
            except httpx.ReadTimeout:
                pass

    async def main():
        for _ in range(20):
            await leave_early(rng.random() < 0.7, rng.choice([0.001, 0.01, 0.05, 0.2]))
        return await two_at_once(server)

    assert all(f in ("length", "stop") for f in asyncio.run(main()))


@pytest.mark.parametrize("flags, message", [
    (["--max-num-seqs", "0"], "max_num_seqs"),
    (["--model", "/nonexistent/model.gguf"], "/nonexistent/model.gguf"),
])
def test_settings_the_engine_refuses_exit_2_with_their_message(flags, message):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "fastdeploy.entrypoints.openai.api_server", "--port", "1", *flags],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr
