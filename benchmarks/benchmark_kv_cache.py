"""KV cache at scale on the default model: prefix caching and chunked prefill, as ratios from one run.

1. Shared system prompt: 64 requests = one ~1,000-token system prompt + a different question each,
   32 new tokens, greedy, max_num_seqs 32; with prefix caching on and off (each its own LLM).
   Reported: output tok/s over the whole call, and mean time to first token (submission to first
   token: RequestMetrics.time_in_queue + first_token_time).
2. Head-of-line blocking: a ~4,000-token prompt is submitted, then a short one right behind it
   (both max_tokens 1). Reported: the short request's time to first token (from submission to its
   output), without chunked prefill, and with it at max_num_batched_tokens 2048 (the default) and 512.

    python benchmarks/benchmark_kv_cache.py
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

import fastdeploy  # noqa: E402,F401  (first: CPU environment before paddle)
from fastdeploy import LLM, SamplingParams  # noqa: E402

SYSTEM = ("You are a meticulous assistant for a public library. Follow the house rules: answer briefly, cite the "
          "section of the catalogue when you can, never invent a book, and say so when you do not know. ")
QUESTION = "Question {i}: is there a good book about the number {i} and where would I find it?"


def shared_prefix(enable_prefix_caching: bool) -> tuple[float, float, int]:
    llm = LLM(max_model_len=2048, max_num_seqs=32, enable_prefix_caching=enable_prefix_caching)
    tokenizer = llm.get_tokenizer()
    system = tokenizer.encode(SYSTEM * 40, add_special_tokens=False)[:1000]
    prompts = [{"prompt_token_ids": system + tokenizer.encode(QUESTION.format(i=i), add_special_tokens=False)}
               for i in range(64)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up (op build, caches)
    llm.reset_prefix_cache()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    ttft = statistics.mean(o.metrics.time_in_queue + o.metrics.first_token_time for o in outputs)
    cached = sum(o.num_cached_tokens for o in outputs)
    return 64 * 32 / wall, ttft, cached


def short_behind_long(**engine_args) -> float:
    llm = LLM(max_model_len=4200, max_num_seqs=8, enable_prefix_caching=False, **engine_args)
    tokenizer = llm.get_tokenizer()
    long_ids = tokenizer.encode("The history of the printing press is long. " * 600, add_special_tokens=False)[:4000]
    short_ids = tokenizer.encode("What is two plus two?", add_special_tokens=False)
    one = SamplingParams(temperature=0, max_tokens=1)
    llm.generate({"prompt_token_ids": short_ids}, one, use_tqdm=False)  # warm-up
    engine = llm.llm_engine
    engine.add_request(None, long_ids, one)
    start = time.perf_counter()
    short_id = engine.add_request(None, short_ids, one)
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id == short_id:
                ttft = time.perf_counter() - start
    return ttft


def main():
    on = shared_prefix(True)
    off = shared_prefix(False)
    print("=== 64 requests sharing a 1,000-token system prompt, 32 new tokens each, greedy ===")
    print(f"{'prefix caching':16s} {'output tok/s':>12s} {'mean TTFT s':>12s} {'cached tokens':>14s}")
    for name, (tps, ttft, cached) in (("on", on), ("off", off)):
        print(f"{name:16s} {tps:12.1f} {ttft:12.2f} {cached:14d}")
    print(f"ratio on/off: throughput {on[0] / off[0]:.2f}x, time to first token {off[1] / on[1]:.2f}x shorter")

    plain = short_behind_long()
    chunked = short_behind_long(enable_chunked_prefill=True)
    small = short_behind_long(enable_chunked_prefill=True, max_num_batched_tokens=512)
    print("=== time to first token of a short request submitted right behind a 4,000-token prompt ===")
    print(f"no chunked prefill:                       {plain:6.2f} s")
    print(f"chunked prefill, 2048 tokens/step:        {chunked:6.2f} s ({plain / chunked:.1f}x shorter)")
    print(f"chunked prefill, 512 tokens/step:         {small:6.2f} s ({plain / small:.1f}x shorter)")


if __name__ == "__main__":
    main()
