"""Soak test: random mixes of LLM calls for --duration seconds, checking invariants after each.

    python benchmarks/soak.py --duration 60 [--seed S] [--rss-every 5]

Three LLMs on the default model: `main` (generate, chat, n > 1, stops, seeds, logprobs, prompt
logprobs, Ctrl-C aborts, reset_prefix_cache), `tiny` (a KV pool of a few blocks: batches of long
requests force preemption) and `ref` (built at start, used only to replay recorded greedy requests).
After every call: one output per prompt in input order with the expected prompt ids, n completions,
valid finish reasons, and each engine idle (no request left, every KV block free, no reference
count held). RSS is sampled every --rss-every seconds. Exit 1 when an invariant fails or RSS grows
by more than 1% from the end of the first 10% of the run (warm-up) to the end.
"""
from __future__ import annotations

import _thread
import argparse
import ctypes
import gc
import os
import random
import signal
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from fastdeploy import LLM, SamplingParams  # noqa: E402
from helpers import assert_same_greedy, top2_gaps  # noqa: E402

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
    _, resident, shared = (int(x) for x in open("/proc/self/statm").read().split()[:3])
    return (resident - shared) * os.sysconf("SC_PAGE_SIZE") / 2**20


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
        return self.report(elapsed, curve, failure)

    def report(self, elapsed, curve, failure) -> int:
        warm = min(curve, key=lambda point: abs(point[0] - 0.1 * elapsed))
        growth = (curve[-1][1] - warm[1]) / warm[1]
        values = [r for _, r in curve]
        print(f"duration: {elapsed:.1f} s")
        for key, value in self.counts.items():
            print(f"{key}: {value}")
        print(f"rss_samples: {len(curve)} (every {self.rss_every:g} s)")
        print(f"rss_mib: min {min(values):.1f} max {max(values):.1f} start {values[0]:.1f} "
              f"warm {warm[1]:.1f} (t={warm[0]:.0f} s) end {values[-1]:.1f}")
        print(f"rss_growth_after_warmup: {100 * growth:+.2f} %")
        print("rss_curve: " + " ".join(f"{t:.0f}:{r:.0f}" for t, r in curve))
        if failure is None and growth > MAX_RSS_GROWTH:
            failure = f"RSS grew {100 * growth:.2f} % after warm-up (limit {100 * MAX_RSS_GROWTH:g} %)"
        print("result: " + ("FAIL " + failure if failure else "PASS"), flush=True)
        return 1 if failure else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, required=True, help="seconds of calls")
    parser.add_argument("--seed", type=int, default=None, help="RNG seed (default: from the clock)")
    parser.add_argument("--rss-every", type=float, default=5.0, help="seconds between RSS samples")
    args = parser.parse_args()
    # a job started in the background (nohup ... &) inherits SIGINT ignored, and interrupt_main()
    # then does nothing: restore Python's handler so the Ctrl-C aborts happen there too
    signal.signal(signal.SIGINT, signal.default_int_handler)
    seed = args.seed if args.seed is not None else int(time.time()) % 100000
    print(f"seed: {seed}", flush=True)
    return Soak(seed, args.duration, args.rss_every).run()


if __name__ == "__main__":
    sys.exit(main())
