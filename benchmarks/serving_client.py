"""One OpenAI-API request over httpx, streamed (SSE) or not, timed chunk by chunk.

The client benchmark_serving.py and soak.py's server mode drive both our server and `vllm serve` with.
It parses the `data: ...` lines itself (a JSON decode per line, nothing else): on a 2-core machine the
client shares the cores with the server it measures, so it stays lean.

`send(client, path, body, max_chunks=None)` posts `body` to `path` (`/v1/completions` or
`/v1/chat/completions`) and returns a `Response`:
  * per choice index: the text, the finish reasons seen (a correct answer has exactly one), and, when
    the request asked for logprobs, each generated token's string and its top-2 logprob gap;
  * for a stream: the arrival time (`time.perf_counter()`, seconds) of each chunk that carried
    generated output and how many tokens it carried (the growth of `usage.completion_tokens` when the
    server sends usage in every chunk, `stream_options.continuous_usage_stats`; else the chunk's
    logprob entries; else 1), how many `data: [DONE]` lines came, and the last usage seen;
  * `max_chunks`: close the stream after that many output chunks (a client that disconnects);
  * `error`: the HTTP status and body start, or the exception, for a request that failed.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Optional

import httpx

logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per request (fastdeploy's logging shows INFO)


@dataclass
class Choice:
    text: str = ""
    finish_reasons: list = field(default_factory=list)
    tokens: list = field(default_factory=list)  # token strings, from logprobs
    gaps: list = field(default_factory=list)  # top-2 logprob gap per token (inf with fewer than 2)


@dataclass
class Response:
    start: float
    choices: dict = field(default_factory=dict)  # index -> Choice
    times: list = field(default_factory=list)  # arrival of each chunk with generated output
    chunk_tokens: list = field(default_factory=list)  # tokens each of those chunks carried
    usage: Optional[dict] = None
    done_lines: int = 0
    closed_early: bool = False
    error: Optional[str] = None

    @property
    def ttft(self) -> float:
        """Seconds from sending to the first chunk with output."""
        return self.times[0] - self.start

    def token_gaps(self) -> list:
        """Inter-token latencies in seconds: each gap between output chunks split evenly over the
        tokens of the later chunk (one entry per token)."""
        out = []
        for before, at, k in zip(self.times, self.times[1:], self.chunk_tokens[1:]):
            out += [(at - before) / k] * k
        return out

    def output_tokens(self) -> int:
        """Generated tokens: the server's usage when it sent one, else the tokens counted in chunks."""
        return self.usage["completion_tokens"] if self.usage else sum(self.chunk_tokens)


def top2_gap(logprobs: list) -> float:
    values = sorted(logprobs, reverse=True)
    return values[0] - values[1] if len(values) > 1 else math.inf


def token_entries(logprobs: Optional[dict]) -> list:
    """[(token string, top-2 gap)] from a choice's `logprobs`: chat's shape ({"content": [{"token",
    "top_logprobs": [{"token", "logprob"}]}]}) or completions' ({"tokens", "top_logprobs": [{token: lp}]})."""
    if not logprobs:
        return []
    if "content" in logprobs:
        return [(e["token"], top2_gap([t["logprob"] for t in e.get("top_logprobs") or []]))
                for e in logprobs["content"] or []]
    tops = logprobs.get("top_logprobs") or [None] * len(logprobs["tokens"])
    return [(t, top2_gap(list((top or {}).values()))) for t, top in zip(logprobs["tokens"], tops)]


def add_choice(resp: Response, choice: dict) -> int:
    """Fold one choice of a chunk (or of a whole answer) into resp; the number of logprob entries it carried."""
    c = resp.choices.setdefault(choice.get("index", 0), Choice())
    message = choice.get("delta") or choice.get("message") or {}
    c.text += choice.get("text") or message.get("content") or message.get("reasoning_content") or ""
    if choice.get("finish_reason") is not None:
        c.finish_reasons.append(choice["finish_reason"])
    entries = token_entries(choice.get("logprobs"))
    c.tokens += [t for t, _ in entries]
    c.gaps += [g for _, g in entries]
    return len(entries)


def add_chunk(resp: Response, event: dict, now: float) -> None:
    """Fold one streamed chunk into resp, timing it when it carried generated output. A chunk without
    choices (the last one of `include_usage`) only brings the usage."""
    choices = event.get("choices") or []
    before = resp.usage["completion_tokens"] if resp.usage else 0
    text_before = sum(len(c.text) for c in resp.choices.values())
    entries = sum(add_choice(resp, choice) for choice in choices)
    if event.get("usage"):
        resp.usage = event["usage"]
    if not choices:
        return
    grew = sum(len(c.text) for c in resp.choices.values()) > text_before
    tokens = resp.usage["completion_tokens"] - before if event.get("usage") else entries or int(grew)
    if tokens > 0 or grew:
        resp.times.append(now)
        resp.chunk_tokens.append(max(tokens, 1))


async def send(client: httpx.AsyncClient, path: str, body: dict, max_chunks: Optional[int] = None) -> Response:
    """Post body (streamed when body["stream"]) and read the answer; see the module docstring."""
    resp = Response(start=time.perf_counter())
    try:
        if not body.get("stream"):
            r = await client.post(path, json=body)
            if r.status_code != 200:
                resp.error = f"HTTP {r.status_code}: {r.text[:300]}"
                return resp
            answer = r.json()
            for choice in answer.get("choices") or []:
                add_choice(resp, choice)
            resp.usage = answer.get("usage")
            return resp
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                resp.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
                return resp
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    resp.done_lines += 1
                    continue
                add_chunk(resp, json.loads(data), time.perf_counter())
                if max_chunks is not None and len(resp.times) >= max_chunks:
                    resp.closed_early = True
                    break  # leaving the block closes the connection: the server sees a disconnect
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        resp.error = f"{type(exc).__name__}: {exc}"
    return resp
