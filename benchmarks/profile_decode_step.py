"""Where a decode step's time goes: GEMM, attention, norm, rotary, activation, sampling, Python.

Runs our engine on the default model (or --model) with B chat prompts, greedy, EOS ignored, and
times every step in which all requests decode (one token each). Inside those steps the functions
listed in `CATEGORIES` are wrapped with timers; time is exclusive (a timed call inside another
timed call counts only for the inner one). "python/other" is the step's wall time minus all
categories: scheduling, batch preparation, output processing, op dispatch between timed calls.

    python benchmarks/profile_decode_step.py                 # batch 1 and 32, 64 new tokens
    python benchmarks/profile_decode_step.py --batch 8 --output-len 128

Only our engine: this explains our own numbers; the side-by-side ratios come from
benchmark_throughput.py.
"""
import argparse
import importlib
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# category -> (module, attribute path) of callables whose time is the category's. Entries that do
# not exist in this checkout are skipped.
CATEGORIES = {
    "gemm": [
        ("fastdeploy.model_executor.layers.linear", "UnquantizedLinearMethod.apply"),
        ("fastdeploy.model_executor.layers.quantization.gguf", "GGUFLinearMethod.apply"),
        ("fastdeploy.model_executor.layers.quantization.packed", "PackedLinearMethod.apply"),
    ],
    "layers (fused)": [  # runs of decoder layers in one op call: their GEMMs, attention, norms, rotary and activation
        ("fastdeploy.model_executor.layers.fused_decoder_layers", "FusedDecoderLayers.__call__"),
    ],
    "attention": [
        ("fastdeploy.model_executor.layers.attention", "PaddleAttentionBackend.forward"),
        ("fastdeploy.model_executor.layers.attention", "PaddleAttentionBackend.init_attention_metadata"),
        ("fastdeploy.model_executor.layers.append_attention", "AppendAttentionBackend.forward"),
        ("fastdeploy.model_executor.layers.append_attention", "AppendAttentionBackend.init_attention_metadata"),
    ],
    "norm": [("fastdeploy.model_executor.layers.normalization", "RMSNorm.forward")],
    "rotary": [("fastdeploy.model_executor.layers.rotary_embedding", "RotaryEmbedding.rotate_")],
    # the MLP outside its two GEMMs: the SwiGLU kernel (chosen at build, so not wrapped by name) and the calls
    "activation": [("fastdeploy.model_executor.layers.mlp", "DenseMLP.forward")],
    "sampling": [
        ("fastdeploy.worker.model_runner", "sample"),
        ("fastdeploy.worker.model_runner", "sampling_metadata"),
    ],
}


class Timers:
    def __init__(self):
        self.total = defaultdict(float)
        self.stack = []  # [category, start, time spent in nested timed calls]
        self.active = False

    def wrap(self, category, fn):
        def timed(*args, **kwargs):
            if not self.active:
                return fn(*args, **kwargs)
            self.stack.append([category, time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                cat, start, nested = self.stack.pop()
                spent = time.perf_counter() - start
                self.total[cat] += spent - nested
                if self.stack:
                    self.stack[-1][2] += spent

        return timed


def install(timers):
    for category, entries in CATEGORIES.items():
        for module_name, path in entries:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            owner_name, _, attr = path.rpartition(".")
            owner = getattr(module, owner_name, None) if owner_name else module
            if owner is None or not hasattr(owner, attr):
                continue
            setattr(owner, attr, timers.wrap(category, getattr(owner, attr)))


def profile(llm, prompts, output_len, timers):
    from fastdeploy import SamplingParams

    engine = llm.llm_engine
    runner = engine.executor.runner
    step_times = []
    original_execute, original_step = runner.execute_model, engine.step
    decode_step = [False]

    def execute(scheduler_output):
        decode_step[0] = all(n == 1 for n in scheduler_output.num_scheduled_tokens.values())
        timers.active = decode_step[0]
        return original_execute(scheduler_output)

    def step():
        start = time.perf_counter()
        out = original_step()
        if decode_step[0]:
            step_times.append(time.perf_counter() - start)
        decode_step[0] = timers.active = False
        return out

    runner.execute_model, engine.step = execute, step
    timers.total.clear()
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    runner.execute_model, engine.step = original_execute, original_step
    return step_times


def report(batch, step_times, totals):
    steps = len(step_times)
    wall = sum(step_times) / steps * 1e3
    print(f"\n=== batch {batch}: {steps} decode steps, {wall:.2f} ms/step, {batch * 1e3 / wall:.1f} tok/s ===")
    print(f"{'part':<16}{'ms/step':>9}{'share':>8}")
    rows = {k: v / steps * 1e3 for k, v in totals.items()}
    rows["python/other"] = wall - sum(rows.values())
    for name in list(CATEGORIES) + ["python/other"]:
        ms = rows.get(name, 0.0)
        print(f"{name:<16}{ms:>9.2f}{ms / wall:>8.1%}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--quantization", default=None, choices=["wint8", "wint4"])
    args = ap.parse_args()
    from fastdeploy import LLM, SamplingParams  # first: fastdeploy prepares the environment for paddle
    from benchmark_throughput import build_prompts

    timers = Timers()
    install(timers)
    llm = LLM(model=args.model, max_num_seqs=max(args.batch), max_model_len=1024, dtype=args.dtype,
              quantization=args.quantization)
    prompts = build_prompts(llm.get_tokenizer(), max(args.batch))
    llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=4),
                 use_tqdm=False)  # warm-up
    for batch in args.batch:
        llm.reset_prefix_cache()
        step_times = profile(llm, prompts[:batch], args.output_len, timers)
        report(batch, step_times, timers.total)


if __name__ == "__main__":
    main()
