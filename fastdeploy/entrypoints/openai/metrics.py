"""Prometheus metrics of the API server (`GET /metrics`), under FastDeploy's `fastdeploy:` names.

Gauges are read from the engine loop's stats at scrape time (engine/async_engine.py EngineStats);
counters and histograms are updated as each request finishes, from its RequestOutput's metrics.
An embedding or score input (one pooled prompt) counts as a request too: its prompt tokens, its
success (finished_reason "stop"), its end-to-end and queue times; it generates no tokens, so it has
no token timings, and it is left out of the prefix-cache hit rates.
Each server has its own registry, so several servers (or tests) in one process never share series.

| name | type | what |
|---|---|---|
| fastdeploy:num_requests_running | gauge | completions in the running batch |
| fastdeploy:num_requests_waiting | gauge | completions queued for admission |
| fastdeploy:gpu_cache_usage_perc | gauge | fraction of usable KV blocks held by requests (FastDeploy's name; CPU memory here) |
| fastdeploy:prompt_tokens_total | counter | prompt tokens of finished requests |
| fastdeploy:generation_tokens_total | counter | generated tokens of finished requests |
| fastdeploy:request_success_total | counter | requests that finished, by finished_reason |
| fastdeploy:time_to_first_token_seconds | histogram | arrival to the first token |
| fastdeploy:time_per_output_token_seconds | histogram | (e2e - TTFT) / (generated tokens - 1), per completion |
| fastdeploy:e2e_request_latency_seconds | histogram | arrival to the last token |
| fastdeploy:request_queue_time_seconds | histogram | arrival to the first model step |
| fastdeploy:hit_req_rate | gauge | fraction of finished requests with a prefix-cache hit |
| fastdeploy:hit_token_rate | gauge | fraction of finished requests' prompt tokens served from the prefix cache |
| fastdeploy:spec_decode_num_draft_tokens_total | counter | draft tokens verified for finished requests (speculative decoding) |
| fastdeploy:spec_decode_num_accepted_tokens_total | counter | those accepted |
"""
from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0, 640.0)
TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class ServerMetrics:
    """The server's registry. `stats` is a zero-argument callable returning the engine's EngineStats."""

    def __init__(self, stats):
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge("fastdeploy:num_requests_running", "Completions in the running batch", registry=r).set_function(
            lambda: stats().num_running)
        Gauge("fastdeploy:num_requests_waiting", "Completions waiting for admission", registry=r).set_function(
            lambda: stats().num_waiting)
        Gauge("fastdeploy:gpu_cache_usage_perc", "Fraction of usable KV-cache blocks in use",
              registry=r).set_function(lambda: stats().kv_cache_usage)
        self.prompt_tokens = Counter("fastdeploy:prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("fastdeploy:generation_tokens", "Generated tokens of finished requests",
                                         registry=r)
        self.success = Counter("fastdeploy:request_success", "Finished requests", ["finished_reason"], registry=r)
        self.draft_tokens = Counter("fastdeploy:spec_decode_num_draft_tokens", "Draft tokens verified", registry=r)
        self.accepted_tokens = Counter("fastdeploy:spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                       registry=r)
        self.ttft = Histogram("fastdeploy:time_to_first_token_seconds", "Time to the first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("fastdeploy:time_per_output_token_seconds", "Time per output token after the first",
                              buckets=TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("fastdeploy:e2e_request_latency_seconds", "Arrival to the last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("fastdeploy:request_queue_time_seconds", "Arrival to the first model step",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self._lock = threading.Lock()
        self._requests = self._hit_requests = self._prompt_tokens = self._hit_tokens = 0
        Gauge("fastdeploy:hit_req_rate", "Fraction of finished requests with a prefix-cache hit",
              registry=r).set_function(lambda: self._rate(self._hit_requests, self._requests))
        Gauge("fastdeploy:hit_token_rate", "Fraction of prompt tokens served from the prefix cache",
              registry=r).set_function(lambda: self._rate(self._hit_tokens, self._prompt_tokens))

    def _rate(self, part: int, whole: int) -> float:
        with self._lock:
            return part / whole if whole else 0.0

    def observe(self, output, completions: list[tuple[int, str]]) -> None:
        """Count one finished prompt: `output` is its last RequestOutput (its metrics: seconds, from
        time.time()), `completions` each completion's (generated tokens, finish_reason)."""
        prompt = len(output.prompt_token_ids)
        m = output.metrics
        end = m.arrival_time + (m.model_execute_time or 0.0)
        ttft = None
        if m.time_in_queue is not None and m.first_token_time is not None:
            ttft = m.time_in_queue + m.first_token_time
            self.ttft.observe(ttft)
        if m.time_in_queue is not None:
            self.queue_time.observe(m.time_in_queue)
        self.e2e.observe(end - m.arrival_time)
        generated = 0
        for n, finish_reason in completions:
            generated += n
            self.success.labels(finished_reason=finish_reason).inc()
            if ttft is not None and n > 1:
                self.tpot.observe(max(end - m.arrival_time - ttft, 0.0) / (n - 1))
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(generated)
        self.draft_tokens.inc(m.num_draft_tokens)
        self.accepted_tokens.inc(m.num_accepted_tokens)
        with self._lock:
            self._requests += 1
            self._prompt_tokens += prompt
            self._hit_requests += output.num_cached_tokens > 0
            self._hit_tokens += output.num_cached_tokens

    def observe_pooling(self, output) -> None:
        """Count one finished pooled prompt (a PoolingRequestOutput; see the module docstring)."""
        m = output.metrics
        if m is not None:
            if m.time_in_queue is not None:
                self.queue_time.observe(m.time_in_queue)
            self.e2e.observe(m.model_execute_time or 0.0)
        self.success.labels(finished_reason="stop").inc()
        self.prompt_tokens.inc(len(output.prompt_token_ids))

    def render(self) -> bytes:
        return generate_latest(self.registry)
