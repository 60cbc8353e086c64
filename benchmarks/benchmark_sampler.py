"""Sampler cost per decode step on the default model: 32 requests decoded together, time spent in
the sampler (penalties, masks, filters, draw, logprobs) per step, for several SamplingParams.

The sampler is timed by wrapping `fastdeploy.worker.model_runner.sample`, so the same script measures
any commit of this engine (run it from another checkout to compare). Each setting: one warm-up
generate, then 32 prompts x 64 tokens, EOS ignored; reported: mean ms per sampling call (one call
per step) and its share of the wall time.

    python benchmarks/benchmark_sampler.py
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

import fastdeploy  # noqa: E402  (first: CPU environment before paddle)
from fastdeploy import LLM, SamplingParams  # noqa: E402
from fastdeploy.worker import model_runner  # noqa: E402

SETTINGS = {
    "greedy": dict(temperature=0),
    "temperature 1.0": dict(temperature=1.0),
    "temperature 0.7, top_p 0.9": dict(temperature=0.7, top_p=0.9),
    "top_k 50, top_p 0.9, min_p 0.05": dict(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05),
    "penalties (rep 1.1, freq 0.5, pres 0.5)": dict(temperature=0.7, top_p=0.9, repetition_penalty=1.1,
                                                    frequency_penalty=0.5, presence_penalty=0.5),
    "logprobs 5": dict(temperature=0.7, top_p=0.9, logprobs=5),
}


def main():
    timings = []
    original = model_runner.sample

    def timed(*args, **kwargs):
        start = time.perf_counter()
        result = original(*args, **kwargs)
        timings.append(time.perf_counter() - start)
        return result

    model_runner.sample = timed
    llm = LLM(max_model_len=512, max_num_seqs=32)
    prompts = [f"Question {i}: tell me something about the number {i}." for i in range(32)]
    print(f"{'setting':42s} {'ms/step':>8s} {'share':>6s}")
    for name, kwargs in SETTINGS.items():
        try:
            params = SamplingParams(max_tokens=64, ignore_eos=True, **kwargs)
        except TypeError as e:  # an older commit without this field
            print(f"{name:42s} {'n/a':>8s}  ({e})")
            continue
        llm.generate(prompts[:4], SamplingParams(max_tokens=4, **kwargs), use_tqdm=False)
        timings.clear()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        print(f"{name:42s} {1e3 * sum(timings) / len(timings):8.2f} {sum(timings) / wall:6.1%}")


if __name__ == "__main__":
    main()
