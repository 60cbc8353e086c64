"""A real API server under load, and clients that leave: one server (metrics on their own port).

- Load: 64 streamed requests (chat and completions mixed, greedy) from 16 concurrent AsyncOpenAI
  clients: each stream carries exactly one finish_reason and ends with one `data: [DONE]` (read from
  the raw bytes), and its tokens equal `LLM.generate` / `LLM.chat` of the same prompt in-process
  with the same settings (the session's smollm_llm), up to a documented near-tie.
- Clients that time out (non-streamed) or close their stream abort the server's work: the running
  gauge and the KV-usage gauge are back to 0 long before the requests could have finished, and a
  fresh request is answered at once.
- `--metrics-port`: /metrics is served there, and the API port answers 404.
"""
import asyncio
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from helpers import SMOLLM_BLOCK_SIZE, SMOLLM_MAX_MODEL_LEN, assert_same_greedy, top2_gaps
from raw_recorder import Recorder, sse_events
from running_server import RunningServer, free_port

from fastdeploy import SamplingParams

TOPICS = ["the sea", "a dragon", "bread", "the moon", "winter", "a library", "trains", "music", "a garden",
          "the desert", "coffee", "a robot", "rain", "mountains", "a cat", "the city"]
NUM_REQUESTS, NUM_CLIENTS = 64, 16
LONG = 600  # tokens of a request that is aborted long before it could finish
GONE_WITHIN_S = 3.0


@pytest.fixture(scope="module")
def server():
    metrics_port = free_port()
    with RunningServer("--max-model-len", str(SMOLLM_MAX_MODEL_LEN), "--block-size", str(SMOLLM_BLOCK_SIZE),
                       "--max-num-seqs", "16", "--metrics-port", str(metrics_port)) as s:
        s.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        yield s


def gauge(server, name: str) -> float:
    text = httpx.get(server.metrics_url, timeout=5).text
    return float(re.search(rf"^fastdeploy:{name} (\S+)$", text, re.M).group(1))


def wait_idle(server, seconds: float = GONE_WITHIN_S) -> float:
    """Seconds until no request runs and no KV block is held; fails after `seconds`."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if gauge(server, "num_requests_running") == 0 and gauge(server, "gpu_cache_usage_perc") == 0:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"still running after {seconds} s: running={gauge(server, 'num_requests_running')}, "
                         f"kv={gauge(server, 'gpu_cache_usage_perc')}\n{server.log_tail()}")


def assert_answers_at_once(server) -> None:
    reply = server.client(timeout=5).completions.create(model=server.model, prompt="Hello", max_tokens=4,
                                                        temperature=0)
    assert reply.choices[0].finish_reason in ("length", "stop")


# ---- load ----------------------------------------------------------------------------------------
def jobs(tok) -> list[dict]:
    """Half completions (prompt token ids), half chats; max_tokens 8..16."""
    out = []
    for i in range(NUM_REQUESTS):
        topic = TOPICS[i % len(TOPICS)]
        job = {"job": i, "max_tokens": 8 + i % 9}
        if i % 2:
            job["messages"] = [{"role": "user", "content": f"Write one sentence about {topic}." if i % 4 == 1
                                else f"What do you know about {topic}?"}]
        else:
            job["prompt"] = tok.encode(f"A short story about {topic}:" if i % 4 == 0 else f"Facts about {topic}:",
                                       add_special_tokens=False)
        out.append(job)
    return out


async def run_job(client, server, job) -> tuple[list[str], list[str], str]:
    """(finish_reasons, generated token texts, text) of one streamed request."""
    common = dict(model=server.model, max_tokens=job["max_tokens"], temperature=0, stream=True,
                  extra_headers={"x-job": str(job["job"])})
    finishes, token_texts, text = [], [], ""
    if "messages" in job:
        stream = await client.chat.completions.create(messages=job["messages"], logprobs=True, **common)
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                token_texts += [t.token for t in (choice.logprobs.content if choice.logprobs else [])]
                finishes += [choice.finish_reason] if choice.finish_reason else []
    else:
        stream = await client.completions.create(prompt=job["prompt"], logprobs=1, **common)
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.text
                token_texts += choice.logprobs.tokens if choice.logprobs else []
                finishes += [choice.finish_reason] if choice.finish_reason else []
    return finishes, token_texts, text


async def load(server, all_jobs) -> tuple[dict, dict]:
    bodies: dict[str, bytearray] = {}
    pending: asyncio.Queue = asyncio.Queue()
    for job in all_jobs:
        pending.put_nowait(job)
    results = {}

    async def client_loop():
        async with httpx.AsyncClient(transport=Recorder(bodies), timeout=60) as http:
            client = server.async_client(http_client=http)
            while not pending.empty():
                job = pending.get_nowait()
                results[job["job"]] = await run_job(client, server, job)

    await asyncio.gather(*(client_loop() for _ in range(NUM_CLIENTS)))
    return results, {int(k): bytes(v) for k, v in bodies.items()}


def references(llm, all_jobs) -> dict:
    """Each job's greedy completion in-process (top-2 logprobs for near-ties)."""
    def params(job):
        return SamplingParams(temperature=0, max_tokens=job["max_tokens"], logprobs=2)

    chats = [j for j in all_jobs if "messages" in j]
    texts = [j for j in all_jobs if "prompt" in j]
    outs = llm.chat([j["messages"] for j in chats], [params(j) for j in chats], use_tqdm=False)
    outs += llm.generate([{"prompt_token_ids": j["prompt"]} for j in texts], [params(j) for j in texts],
                         use_tqdm=False)
    return {j["job"]: o.outputs for j, o in zip(chats + texts, outs)}


def test_64_streams_from_16_clients_each_answered_once_with_the_offline_greedy_tokens(server, smollm_llm, tok,
                                                                                        no_hang):
    all_jobs = jobs(tok)
    results, raw = asyncio.run(load(server, all_jobs))
    refs = references(smollm_llm, all_jobs)
    assert sorted(results) == sorted(raw) == list(range(NUM_REQUESTS))
    for job in all_jobs:
        i, ref = job["job"], refs[job["job"]]
        finishes, token_texts, text = results[i]
        events = sse_events(raw[i])
        assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1, events[-3:]
        assert finishes == [ref.finish_reason], (i, finishes)
        ref_texts = [d[t].decoded_token for d, t in zip(ref.logprobs, ref.token_ids)]
        assert_same_greedy(token_texts, ref_texts, top2_gaps(ref), f"job {i}")
        if token_texts == ref_texts:
            assert text == ref.text, i
    assert wait_idle(server) >= 0


# ---- clients that leave --------------------------------------------------------------------------
def test_client_timeouts_abort_the_server_work(server, no_hang):
    client = server.client(timeout=0.5)

    def long_request(i):
        with pytest.raises(openai.APITimeoutError):
            client.completions.create(model=server.model, prompt=f"Story number {i}:", max_tokens=LONG,
                                      temperature=0, extra_body={"ignore_eos": True})

    running_seen = 0
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(long_request, i) for i in range(4)]
        while not all(f.done() for f in futures):
            running_seen = max(running_seen, gauge(server, "num_requests_running"))
            time.sleep(0.02)
        for f in futures:
            f.result()
    assert running_seen >= 1  # they did reach the engine
    wait_idle(server)  # LONG tokens each would take many seconds more
    assert_answers_at_once(server)


def test_a_stream_closed_after_a_few_chunks_aborts_its_request(server, no_hang):
    stream = server.client(timeout=30).completions.create(model=server.model, prompt="Once upon a time",
                                                          max_tokens=LONG, temperature=0, stream=True,
                                                          extra_body={"ignore_eos": True})
    for _, chunk in zip(range(3), stream):
        assert chunk.choices[0].finish_reason is None
    assert gauge(server, "num_requests_running") == 1 and gauge(server, "gpu_cache_usage_perc") > 0
    stream.close()
    wait_idle(server)
    assert_answers_at_once(server)


def test_metrics_are_served_on_the_metrics_port_only(server):
    metrics = httpx.get(server.metrics_url, timeout=5)
    assert metrics.status_code == 200 and "fastdeploy:num_requests_running" in metrics.text
    assert "fastdeploy:e2e_request_latency_seconds_bucket" in metrics.text
    on_api_port = httpx.get(server.url + "/metrics", timeout=5)
    assert on_api_port.status_code == 404 and on_api_port.json()["error"]["type"] == "not_found_error"
