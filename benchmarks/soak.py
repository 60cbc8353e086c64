"""Soak test: random mixes of LLM calls for --duration seconds, checking invariants after each.

    python benchmarks/soak.py --duration 60 [--seed S] [--rss-every 5]

Three LLMs on the default model: `main` (generate, chat, n > 1, stops, seeds, logprobs, prompt
logprobs, Ctrl-C aborts, reset_prefix_cache), `tiny` (a KV pool of a few blocks: batches of long
requests force preemption) and `ref` (built at start, used only to replay recorded greedy requests).
After every call: one output per prompt in input order with the expected prompt ids, n completions,
valid finish reasons, and each engine idle (no request left, every KV block free, no reference
count held). RSS is sampled every --rss-every seconds. Exit 1 when an invariant fails or RSS grows
by more than 1% from the end of the first 10% of the run (warm-up) to the end.

    python benchmarks/soak.py --server --duration 1800 [--clients 4] [--rss-every 30] [--url U --server-pid P]

Server mode: our OpenAI-compatible server on the default model, started here (or the one at --url,
process --server-pid), gets random completions and chats, streamed or not, greedy or sampled, from
--clients concurrent tasks, some closing their stream after a few chunks (disconnects), some replaying
a recorded greedy request. Every request not disconnected is answered exactly once (one [DONE] per
stream, one finish_reason per choice); greedy replays give the same tokens. After each round of
--rss-every seconds, /metrics must show no request running or waiting, and the anonymous RSS of the
server's process tree is sampled. Exit 1 when a check fails or that RSS grows by more than 2% after
the warm-up (the first 10%).
"""
from __future__ import annotations

import _thread
import argparse
import asyncio
import ctypes
import gc
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

ENV_AT_START = dict(os.environ)  # the server mode's server gets this: `import paddle` sets OMP_NUM_THREADS=1

import httpx  # noqa: E402
from fastdeploy import LLM, SamplingParams  # noqa: E402
from helpers import assert_same_greedy, top2_gaps  # noqa: E402
from server_process import ServerProcess, anon_rss_mib, exit_on_sigterm, free_port, ours_command, ours_env, tree_rss_mib  # noqa: E402
from serving_client import send  # noqa: E402

MAX_RSS_GROWTH = 0.01
TEXTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,",
         "In a distant galaxy, a small robot", "The recipe for pancakes:", "Dear diary, today I",
         "Water boils at", "The quick brown fox", "Here is a list of colors: red,"]
QUESTIONS = ["Say OK.", "Name a fruit.", "What is 2 + 2?", "Write a haiku about rain.", "Who are you?"]
STOPS = [".", "\n", " the", ",", "!"]


def rss_mib() -> float:
    """Anonymous resident memory (RSS less file-backed pages, which the kernel may drop and map
    again when other processes need memory)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # count what is held, not what the heap keeps spare
    return anon_rss_mib(os.getpid())


class Soak:
    def __init__(self, seed: int, duration: float, rss_every: float):
        self.rng = random.Random(seed)
        self.duration, self.rss_every = duration, rss_every
        common = dict(max_model_len=512, block_size=16, max_num_seqs=8, num_gpu_blocks_override=257, seed=seed)
        self.main = LLM(**common)
        self.tiny = LLM(max_model_len=256, block_size=16, max_num_seqs=8, num_gpu_blocks_override=18, seed=seed)
        self.ref = LLM(**common)
        self.tok = self.main.get_tokenizer()
        self.counts = dict(calls=0, requests=0, aborts=0, abort_timer_late=0, greedy_checks=0, near_tie_divergences=0,
                           resets=0, preemptions=0)
        self.recorded: list = []  # (prompt ids, params, token ids) of greedy requests of `main`
        for llm in (self.main, self.tiny):
            self._count_preemptions(llm)

    def _count_preemptions(self, llm) -> None:
        scheduler = llm.llm_engine.scheduler
        preempt = scheduler._preempt

        def counted(request):
            self.counts["preemptions"] += 1
            return preempt(request)

        scheduler._preempt = counted  # observation only: the soak counts, the scheduler decides

    # ---- random inputs ---------------------------------------------------------------------------
    def params(self, max_tokens: int = 24) -> SamplingParams:
        r = self.rng
        greedy = r.random() < 0.5
        kw = dict(temperature=0.0 if greedy else r.choice([0.7, 1.0]), max_tokens=r.randint(1, max_tokens))
        if not greedy:
            kw.update(n=r.choice([1, 1, 2, 3]), top_p=r.choice([1.0, 0.9]), top_k=r.choice([0, 20]))
            if r.random() < 0.5:
                kw["seed"] = r.randint(0, 2**31 - 1)
        if r.random() < 0.3:
            kw["stop"] = r.sample(STOPS, r.randint(1, 2))
        if r.random() < 0.2:
            kw["stop_token_ids"] = [r.choice(self.tok.encode(" the", add_special_tokens=False))]
        if r.random() < 0.2:
            kw["ignore_eos"] = True
        kw["logprobs"] = r.choice([None, 0, 2, 5]) if not greedy else r.choice([2, 5])  # greedy: gaps
        if r.random() < 0.2:
            kw["prompt_logprobs"] = r.choice([0, 1, 3])
        return SamplingParams(**kw)

    def prompts(self, k: int) -> list:
        out = []
        for _ in range(k):
            text = self.rng.choice(TEXTS)
            out.append(text if self.rng.random() < 0.7 else {"prompt_token_ids": self.tok.encode(text, add_special_tokens=False)})
        return out

    def prompt_ids(self, p) -> list[int]:
        return p["prompt_token_ids"] if isinstance(p, dict) else self.tok.encode(p, add_special_tokens=False)

    # ---- checks ----------------------------------------------------------------------------------
    def check(self, llm, outputs, expected_ids, params, aborted: bool = False) -> None:
        if outputs is not None:
            assert len(outputs) == len(expected_ids), f"{len(outputs)} outputs for {len(expected_ids)} prompts"
            for i, (out, ids, p) in enumerate(zip(outputs, expected_ids, params)):
                assert out is not None, f"prompt {i}: no output"
                assert list(out.prompt_token_ids) == ids, f"prompt {i}: output out of order or wrong prompt ids"
                assert len(out.outputs) == p.n, f"prompt {i}: {len(out.outputs)} completions, n={p.n}"
                for c in out.outputs:
                    assert c.finish_reason in ("stop", "length"), f"prompt {i}: finish_reason {c.finish_reason}"
                    assert 1 <= len(c.token_ids) <= p.max_tokens, f"prompt {i}: {len(c.token_ids)} tokens"
                    if p.logprobs is not None:
                        assert len(c.logprobs) == len(c.token_ids), f"prompt {i}: logprobs per token"
                if p.prompt_logprobs is not None:
                    assert len(out.prompt_logprobs) == len(ids), f"prompt {i}: prompt_logprobs length"
        engine = llm.llm_engine
        pool = engine.block_pool
        assert not engine.has_unfinished_requests(), "unfinished requests while idle"
        assert engine.output_processor.groups == {}, "output groups left while idle"
        assert pool.num_free_blocks == pool.num_usable_blocks, (
            f"{pool.num_usable_blocks - pool.num_free_blocks} KV blocks in use while idle")
        assert all(c == 0 for c in pool.ref_counts), "a block reference count is held while idle"

    # ---- actions ---------------------------------------------------------------------------------
    def do_generate(self, llm=None, k_max: int = 4, max_tokens: int = 24) -> None:
        llm = llm or self.main
        prompts = self.prompts(self.rng.randint(1, k_max))
        params = [self.params(max_tokens) for _ in prompts]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        self.counts["requests"] += len(prompts)
        ids = [self.prompt_ids(p) for p in prompts]
        self.check(llm, outputs, ids, params)
        if llm is self.main:
            for i, p, out in zip(ids, params, outputs):
                if p.temperature == 0 and len(self.recorded) < 200:
                    self.recorded.append((i, p, list(out.outputs[0].token_ids)))

    def do_chat(self) -> None:
        convs = [[{"role": "user", "content": self.rng.choice(QUESTIONS)}] for _ in range(self.rng.randint(1, 3))]
        params = [self.params() for _ in convs]
        outputs = self.main.chat(convs, params, use_tqdm=False)
        self.counts["requests"] += len(convs)
        ids = [self.tok.encode(o.prompt, add_special_tokens=False) for o in outputs]
        self.check(self.main, outputs, ids, params)

    def do_abort(self) -> None:
        prompts = self.prompts(self.rng.randint(1, 4))
        params = SamplingParams(temperature=0.8, max_tokens=96, ignore_eos=True)
        timer = threading.Timer(self.rng.uniform(0.05, 1.5), _thread.interrupt_main)
        outputs = None
        try:
            timer.start()
            outputs = self.main.generate(prompts, params, use_tqdm=False)
            timer.cancel()
            timer.join()
            self.counts["abort_timer_late"] += 1
            time.sleep(0.01)  # an interrupt raised just before cancel() lands here
        except KeyboardInterrupt:
            self.counts["aborts"] += 1
            outputs = None
        timer.join()
        self.counts["requests"] += len(prompts)
        self.check(self.main, outputs, [self.prompt_ids(p) for p in prompts], [params] * len(prompts))

    def do_reset(self) -> None:
        assert self.main.reset_prefix_cache() is True
        self.counts["resets"] += 1
        self.check(self.main, None, [], [])

    def do_tiny(self) -> None:
        prompts = [t * self.rng.randint(2, 5) for t in self.rng.sample(TEXTS, self.rng.randint(4, 8))]
        params = [SamplingParams(temperature=0, max_tokens=self.rng.randint(32, 96), ignore_eos=True, logprobs=2)
                  for _ in prompts]
        outputs = self.tiny.generate(prompts, params, use_tqdm=False)
        self.counts["requests"] += len(prompts)
        self.check(self.tiny, outputs, [self.prompt_ids(p) for p in prompts], params)
        i = self.rng.randrange(len(prompts))  # preemption changes timing, never tokens
        self.compare_on_ref(self.prompt_ids(prompts[i]), params[i], list(outputs[i].outputs[0].token_ids))

    def do_greedy_check(self) -> None:
        if self.recorded:
            self.compare_on_ref(*self.rng.choice(self.recorded))

    def compare_on_ref(self, ids, params, tokens) -> None:
        out = self.ref.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0].outputs[0]
        self.check(self.ref, None, [], [])
        self.counts["greedy_checks"] += 1
        if list(out.token_ids) != tokens:
            self.counts["near_tie_divergences"] += 1
        assert_same_greedy(tokens, list(out.token_ids), top2_gaps(out), "greedy replay")

    def warm_up(self) -> None:
        """Commit the memory that is committed lazily, once, before the clock starts: every KV block
        of each pool (memory is committed as a block is first written) and the dense weights made
        for the first batch of 64 rows or more. Growth after this is what the soak looks for."""
        for llm in (self.main, self.ref, self.tiny):
            cfg = llm.llm_engine.config.scheduler_config
            seqs, length = cfg.max_num_seqs, cfg.max_model_len - 8
            prompts = [{"prompt_token_ids": [(7 * i + j) % 1000 + 100 for j in range(length)]} for i in range(seqs)]
            # prompt_logprobs: logits of 64+ rows, which makes the lm_head's dense copy
            llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=0),
                         use_tqdm=False)
            llm.reset_prefix_cache()
            self.check(llm, None, [], [])

    # ---- the run ---------------------------------------------------------------------------------
    def run(self) -> int:
        actions = [(self.do_generate, 30), (self.do_chat, 15), (self.do_abort, 10), (self.do_reset, 5),
                   (self.do_tiny, 10), (self.do_greedy_check, 10)]
        funcs, weights = zip(*actions)
        self.warm_up()
        self.counts["preemptions"] = 0
        start = time.monotonic()
        curve = [(0.0, rss_mib())]
        failure = None
        while time.monotonic() - start < self.duration:
            action = self.rng.choices(funcs, weights)[0]
            try:
                action()
            except AssertionError as exc:
                failure = f"invariant failed in {action.__name__} after {self.counts['calls']} calls: {exc}"
                break
            self.counts["calls"] += 1
            if time.monotonic() - start - curve[-1][0] >= self.rss_every:
                curve.append((time.monotonic() - start, rss_mib()))
                print(f"t={curve[-1][0]:.0f}s rss={curve[-1][1]:.1f}MiB {self.counts}", flush=True)
        elapsed = time.monotonic() - start
        curve.append((elapsed, rss_mib()))
        return report(elapsed, curve, self.counts, self.rss_every, failure, MAX_RSS_GROWTH)

MAX_SERVER_RSS_GROWTH = 0.02
SERVER_FLAGS = ["--max-model-len", "512", "--block-size", "16", "--max-num-seqs", "8",
                "--num-gpu-blocks-override", "257"]  # like `main` above: a pool the warm-up fills
WARM_UP_TEXT = "The quick brown fox jumps over the lazy dog. " * 48  # ~480 tokens on the default model
RUNNING = ("fastdeploy:num_requests_running", "fastdeploy:num_requests_waiting")


def metric(text: str, name: str) -> float:
    """The sum over label sets of metric `name` in a Prometheus text page; KeyError when it is absent."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " ")]
    if not values:
        raise KeyError(f"/metrics has no {name}")
    return sum(values)


class ServerSoak:
    """Random OpenAI-API requests from `clients` concurrent tasks against the server at url (process pid).

    Clients run in rounds of `idle_every` seconds; after each round the server must report no request
    running or waiting on /metrics within 30 s, and its process tree's anonymous RSS is sampled then.
    """

    def __init__(self, seed: int, duration: float, url: str, pid: int, clients: int, idle_every: float):
        self.rng = random.Random(seed)
        self.duration, self.url, self.pid, self.clients, self.idle_every = duration, url, pid, clients, idle_every
        self.counts = dict(requests=0, streamed=0, chat=0, disconnects=0, greedy_checks=0, near_tie_divergences=0,
                           idle_checks=0)
        self.recorded: list = []  # (path, body, reference response) of answered greedy requests
        self.failure = None
        self.model = None

    # ---- random requests -------------------------------------------------------------------------
    def body(self, chat: bool, greedy: bool, stream: bool) -> dict:
        r = self.rng
        b = {"model": self.model, "max_tokens": r.randint(1, 48), "temperature": 0.0 if greedy else r.choice([0.7, 1.0])}
        if chat:
            b["messages"] = [{"role": "user", "content": r.choice(QUESTIONS)}]
        else:
            b["prompt"] = r.choice(TEXTS)
        if not greedy:
            b.update(n=r.choice([1, 1, 2, 3]), top_p=r.choice([1.0, 0.9]))
            if r.random() < 0.5:
                b["seed"] = r.randint(0, 2**31 - 1)
        if r.random() < 0.3:
            b["stop"] = r.sample(STOPS, r.randint(1, 2))
        if r.random() < 0.2:
            b["ignore_eos"] = True
        if greedy:  # tokens and top-2 gaps to compare replays with
            b.update({"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2})
        if stream:
            b.update(stream=True, stream_options={"include_usage": True})
        return b

    async def request(self, client) -> None:
        """One random request: completion or chat, streamed or not, greedy or sampled, a disconnect, or a
        replay of a recorded greedy request."""
        r = self.rng
        kind = r.choices(["new", "disconnect", "replay"], [70, 15, 15])[0]
        if kind == "replay" and self.recorded:
            return await self.replay(client, *r.choice(self.recorded))
        chat, stream = r.random() < 0.4, kind == "disconnect" or r.random() < 0.6
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body = self.body(chat, greedy=r.random() < 0.5, stream=stream)
        max_chunks = None
        if kind == "disconnect":
            body.update(max_tokens=r.randint(32, 128), ignore_eos=True)
            max_chunks = r.randint(1, 8)
        resp = await send(client, path, body, max_chunks)
        self.counts.update(requests=self.counts["requests"] + 1, streamed=self.counts["streamed"] + stream,
                           chat=self.counts["chat"] + chat)
        if resp.closed_early:
            self.counts["disconnects"] += 1
            return
        self.check(resp, body)
        if body["temperature"] == 0 and len(self.recorded) < 200:
            self.recorded.append((path, body, resp))

    async def replay(self, client, path: str, body: dict, reference) -> None:
        """The recorded greedy request again, streamed or not: the same tokens (from a near-tie of the
        reference on they may differ) and, where the tokens agree, the same text."""
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        if self.rng.random() < 0.5:
            body.update(stream=True, stream_options={"include_usage": True})
        resp = await send(client, path, body)
        self.counts.update(requests=self.counts["requests"] + 1, greedy_checks=self.counts["greedy_checks"] + 1)
        self.check(resp, body)
        got, ref = resp.choices[0], reference.choices[0]
        if got.tokens != ref.tokens:
            self.counts["near_tie_divergences"] += 1
        assert_same_greedy(got.tokens, ref.tokens, ref.gaps, f"greedy replay of {path}")
        assert got.tokens != ref.tokens or got.text == ref.text, (
            f"greedy replay of {path}: the same tokens, text {got.text!r} != {ref.text!r}")

    def check(self, resp, body: dict) -> None:
        """Answered exactly once: no error, one [DONE] for a stream, choices 0..n-1 with one finish_reason each."""
        assert resp.error is None, f"request lost: {resp.error} (body {body})"
        if body.get("stream"):
            assert resp.done_lines == 1, f"{resp.done_lines} [DONE] lines (body {body})"
        n = body.get("n", 1)
        assert sorted(resp.choices) == list(range(n)), f"choices {sorted(resp.choices)} for n={n}"
        for i, c in resp.choices.items():
            assert len(c.finish_reasons) == 1 and c.finish_reasons[0] in ("stop", "length"), (
                f"choice {i}: finish reasons {c.finish_reasons} (body {body})")
            if body.get("logprobs"):
                assert 1 <= len(c.tokens) <= body["max_tokens"], f"choice {i}: {len(c.tokens)} logprob tokens"

    # ---- rounds ----------------------------------------------------------------------------------
    async def client_task(self, client, until: float) -> None:
        while self.failure is None and time.monotonic() < until:
            try:
                await self.request(client)
            except Exception as exc:  # an AssertionError from a check, or an answer of an unexpected shape
                self.failure = f"{type(exc).__name__}: {exc} (after {self.counts['requests']} requests)"

    async def wait_idle(self, client, timeout: float = 30.0) -> None:
        """Poll /metrics until no request is running or waiting; a failure after timeout seconds."""
        start = time.monotonic()
        while True:
            try:
                text = (await client.get("/metrics")).text
                left = {name: metric(text, name) for name in RUNNING}
            except (KeyError, httpx.HTTPError) as exc:
                self.failure = f"/metrics: {exc}"
                return
            if not any(left.values()):
                self.counts["idle_checks"] += 1
                return
            if time.monotonic() - start > timeout:
                self.failure = f"not idle {timeout:.0f} s after the clients stopped: {left}"
                return
            await asyncio.sleep(0.5)

    async def warm_up(self, client) -> None:
        """8 long prompts at once, distinct from their first token (no shared prefix): the KV blocks,
        whose memory is committed as they are first written, are committed before the clock starts."""
        bodies = [{"model": self.model, "prompt": f"{i} {WARM_UP_TEXT}", "max_tokens": 8, "temperature": 0.0}
                  for i in range(8)]
        for resp, body in zip(await asyncio.gather(*(send(client, "/v1/completions", b) for b in bodies)), bodies):
            self.check(resp, body)

    async def run(self) -> tuple:
        """(seconds, RSS curve [(seconds, MiB)], failure or None) of the whole soak."""
        limits = httpx.Limits(max_connections=self.clients + 8)
        async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(120.0), limits=limits) as client:
            self.model = (await client.get("/v1/models")).json()["data"][0]["id"]
            await self.warm_up(client)
            await self.wait_idle(client)
            start = time.monotonic()
            curve = [(0.0, tree_rss_mib(self.pid))]
            while self.failure is None and time.monotonic() - start < self.duration:
                until = min(start + self.duration, time.monotonic() + self.idle_every)
                await asyncio.gather(*(self.client_task(client, until) for _ in range(self.clients)))
                if self.failure is None:
                    await self.wait_idle(client)
                curve.append((time.monotonic() - start, tree_rss_mib(self.pid)))
                print(f"t={curve[-1][0]:.0f}s server rss={curve[-1][1]:.1f}MiB {self.counts}", flush=True)
        return time.monotonic() - start, curve, self.failure


def run_server_soak(args, seed: int) -> int:
    """The server mode: the soak against args.url (process args.server_pid), or against our server on the
    default model, started here and stopped at the end."""
    if args.url:
        return soak_server(args, seed, args.url.rstrip("/"), args.server_pid)
    from fastdeploy.model_executor.model_loader.model_path import default_model_path

    port = free_port()
    cmd = ours_command(default_model_path(), port, SERVER_FLAGS + ["--seed", str(seed)])
    with ServerProcess(cmd, ours_env(ENV_AT_START), Path(tempfile.gettempdir()) / f"fd_soak_server_{port}.log",
                       port) as server:
        print(f"server: {' '.join(cmd)} (log: {server.log_path})", flush=True)
        print(f"server ready after {server.wait_ready():.1f} s", flush=True)
        return soak_server(args, seed, server.url, server.pid)


def soak_server(args, seed: int, url: str, pid: int) -> int:
    soak = ServerSoak(seed, args.duration, url, pid, args.clients, args.rss_every)
    elapsed, curve, failure = asyncio.run(soak.run())
    return report(elapsed, curve, soak.counts, args.rss_every, failure, MAX_SERVER_RSS_GROWTH)


def report(elapsed, curve, counts, every, failure, max_growth) -> int:
    """Print the counts, the RSS curve [(seconds, MiB)] and the result; 1 on a failure or when RSS at the
    end exceeds RSS at 10% of the run by more than max_growth (a fraction), else 0."""
    warm = min(curve, key=lambda point: abs(point[0] - 0.1 * elapsed))
    growth = (curve[-1][1] - warm[1]) / warm[1]
    values = [r for _, r in curve]
    print(f"duration: {elapsed:.1f} s")
    for key, value in counts.items():
        print(f"{key}: {value}")
    print(f"rss_samples: {len(curve)} (every {every:g} s)")
    print(f"rss_mib: min {min(values):.1f} max {max(values):.1f} start {values[0]:.1f} "
          f"warm {warm[1]:.1f} (t={warm[0]:.0f} s) end {values[-1]:.1f}")
    print(f"rss_growth_after_warmup: {100 * growth:+.2f} %")
    print("rss_curve: " + " ".join(f"{t:.0f}:{r:.0f}" for t, r in curve))
    if failure is None and growth > max_growth:
        failure = f"RSS grew {100 * growth:.2f} % after warm-up (limit {100 * max_growth:g} %)"
    print("result: " + ("FAIL " + failure if failure else "PASS"), flush=True)
    return 1 if failure else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, required=True, help="seconds of calls")
    parser.add_argument("--seed", type=int, default=None, help="RNG seed (default: from the clock)")
    parser.add_argument("--rss-every", type=float, default=None, help="seconds between RSS samples (default 5; "
                        "--server: 30, the length of a round of requests between idle checks)")
    parser.add_argument("--server", action="store_true", help="soak an OpenAI-compatible server instead")
    parser.add_argument("--url", help="--server: the running server to soak (default: start ours on the default model)")
    parser.add_argument("--server-pid", type=int, help="--url: the server's process id, for its RSS")
    parser.add_argument("--clients", type=int, default=4, help="--server: concurrent clients")
    args = parser.parse_args()
    if args.url and not (args.server and args.server_pid):
        parser.error("--url needs --server and --server-pid (the server's RSS is read from /proc/<pid>)")
    if args.clients < 1:
        parser.error(f"--clients must be >= 1, got {args.clients}")
    args.rss_every = args.rss_every or (30.0 if args.server else 5.0)
    seed = args.seed if args.seed is not None else int(time.time()) % 100000
    print(f"seed: {seed}", flush=True)
    if args.server:
        exit_on_sigterm()  # stop the server on SIGTERM too
        return run_server_soak(args, seed)
    # a job started in the background (nohup ... &) inherits SIGINT ignored, and interrupt_main()
    # then does nothing: restore Python's handler so the Ctrl-C aborts happen there too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return Soak(seed, args.duration, args.rss_every).run()


if __name__ == "__main__":
    sys.exit(main())
