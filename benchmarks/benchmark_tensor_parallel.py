"""What tensor parallelism costs and saves here: TP = 1 and 2 on the default model and on a random
checkpoint of ERNIE-4.5-0.3B's shapes (written once by benchmark_load_ernie.py's writer), in each
weight format of `--formats` (TP keeps the format: every rank packs its own shard):
  * bfloat16 (the default): `dtype="bfloat16"` (the GGUF model: its blocks dequantized to bf16);
  * float32: `dtype="float32"` (the GGUF model: its blocks, as stored);
  * wint8, wint4: `quantization=...` (float checkpoints only: skipped for the GGUF model).

Each configuration runs in a fresh child process (the engine, plus its worker processes for TP = 2)
and reports:
  * start-up: wall time of LLM(...);
  * batched output tok/s: B prompts x L new tokens, greedy, EOS ignored, one generate;
  * single-stream decode tok/s: (L - 1) / (t_L - t_1) for one prompt;
  * collective time per step on each rank (all-reduces, the logits all-gather and the token
    broadcast; waiting for the slower rank included), from the workers' own counters
    (TensorParallelGroup.comm_seconds) over the single-stream runs, against the step time;
  * resident memory of each process that holds weights (the engine for TP = 1, each rank for
    TP = 2) after the runs, beside a bare process's (imports only), the bytes of the parameters
    each such process holds (as held: packed weights as their buffers), and the model's fp32
    weight and KV-cache bytes divided by the rank count.

    python benchmarks/benchmark_tensor_parallel.py [--models smollm,ernie] [--formats bfloat16,float32,wint8,wint4]
        [--batch 8] [--tokens 32]
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
ENV_AT_START = dict(os.environ)
KV_BLOCKS, BLOCK_SIZE = 64, 64
GiB = 2**30
FORMATS = {"bfloat16": dict(dtype="bfloat16"), "float32": dict(dtype="float32"),
           "wint8": dict(quantization="wint8"), "wint4": dict(quantization="wint4")}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(model: str, size: int, weight_format: str, batch: int, tokens: int) -> dict:
    import fastdeploy  # noqa: F401  (first: CPU environment before paddle)
    from fastdeploy import LLM, SamplingParams
    from fastdeploy.engine.engine import LLMEngine
    from fastdeploy.worker.tp_worker import parameter_bytes

    bare = rss_bytes()
    start = time.perf_counter()
    llm = LLM(model=model, tensor_parallel_size=size, max_model_len=512, max_num_seqs=batch,
              num_gpu_blocks_override=KV_BLOCKS, block_size=BLOCK_SIZE, enable_prefix_caching=False,
              **FORMATS[weight_format])
    startup = time.perf_counter() - start
    steps = [0]
    step = LLMEngine.step

    def counted(self):
        steps[0] += 1
        return step(self)

    LLMEngine.step = counted
    executor = llm.llm_engine.executor
    prompts = [{"prompt_token_ids": list(range(100 + 7 * i, 132 + 7 * i))} for i in range(batch)]

    def run(n, count):
        t = time.perf_counter()
        llm.generate(prompts[:count], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t

    run(2, batch)  # warm-up
    batched = batch * tokens / run(tokens, batch)
    comm0 = [s.comm_seconds for s in executor.worker_stats()] if size > 1 else []
    steps[0] = 0
    t1 = run(1, 1)
    t_l = run(tokens, 1)
    step_s = (t1 + t_l) / steps[0]
    stats = executor.worker_stats() if size > 1 else []
    config = llm.llm_engine.config
    mc = config.model_config
    return {
        "startup_s": startup, "batched_tok_s": batched, "decode_tok_s": (tokens - 1) / (t_l - t1),
        "step_ms": 1000 * step_s,
        "comm_ms_per_step": [1000 * (s.comm_seconds - c) / steps[0] for s, c in zip(stats, comm0)],
        "rss_gib": [s.resident_bytes / GiB for s in stats] if stats else [rss_bytes() / GiB],
        "params_gib": ([s.parameter_bytes / GiB for s in stats] if stats
                       else [parameter_bytes(executor.runner.model) / GiB]),
        "engine_rss_gib": rss_bytes() / GiB, "bare_rss_gib": bare / GiB,
        "weights_gib_per_rank": mc.weight_bytes() / size / GiB,
        "kv_gib_per_rank": KV_BLOCKS * BLOCK_SIZE * mc.kv_bytes_per_token() / size / GiB,
    }


def model_paths(names: list[str], ernie_dir: Path) -> dict:
    from fastdeploy.model_executor.model_loader.model_path import default_model_path

    paths = {}
    for name in names:
        if name == "smollm":
            paths["SmolLM2-135M Q4_1 GGUF"] = default_model_path()
        else:
            if not (ernie_dir / "config.json").is_file():
                from benchmark_load_ernie import write_checkpoint

                write_checkpoint(ernie_dir)
            paths["ERNIE-4.5-0.3B shapes (random)"] = str(ernie_dir)
    return paths


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm,ernie")
    parser.add_argument("--formats", default="bfloat16", help=f"comma-separated, of {sorted(FORMATS)}")
    parser.add_argument("--ernie-dir", default="/tmp/ernie-0.3b-random")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "SIZE", "FORMAT"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.child[2], args.batch, args.tokens)))
        return
    formats = args.formats.split(",")
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        parser.error(f"--formats: {unknown} unknown; choose from {sorted(FORMATS)}")
    print(f"load average at start: {os.getloadavg()}, cores: {len(os.sched_getaffinity(0))}")
    for label, path in model_paths(args.models.split(","), Path(args.ernie_dir)).items():
        for weight_format in formats:
            if path.endswith(".gguf") and weight_format.startswith("wint"):
                print(f"=== {label}: {weight_format} skipped (quantization applies to float checkpoints) ===")
                continue
            report(label, path, weight_format, args)
    print(f"load average at end: {os.getloadavg()}")


def report(label: str, path: str, weight_format: str, args) -> None:
    """Run TP = 1 and 2 of one model in one format, each in a fresh process, and print their rows."""
    results = {}
    for size in (1, 2):
        out = subprocess.run([sys.executable, __file__, "--child", path, str(size), weight_format,
                              "--batch", str(args.batch), "--tokens", str(args.tokens)],
                             env=ENV_AT_START, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"TP={size} {weight_format} on {label} failed:\n{out.stderr[-3000:]}")
        results[size] = json.loads(out.stdout.strip().splitlines()[-1])
    held = {"float32": " (its blocks as stored)", "bfloat16": " (blocks dequantized)"} if path.endswith(".gguf") else {}
    print(f"=== {label}, {weight_format}{held.get(weight_format, '')}: batch {args.batch} x {args.tokens} tokens, "
          f"{KV_BLOCKS} KV blocks of {BLOCK_SIZE} ===")
    for size, r in results.items():
        comm = ", ".join(f"{c:.1f}" for c in r["comm_ms_per_step"]) or "-"
        rss = ", ".join(f"{g:.2f}" for g in r["rss_gib"])
        params = ", ".join(f"{g:.2f}" for g in r["params_gib"])
        print(f"TP={size}: start-up {r['startup_s']:.1f} s, batched {r['batched_tok_s']:.1f} tok/s, "
              f"single stream {r['decode_tok_s']:.1f} tok/s ({r['step_ms']:.1f} ms/step, collectives "
              f"{comm} ms/step per rank); RSS per process holding weights {rss} GiB (parameters {params} GiB; "
              f"bare process {r['bare_rss_gib']:.2f}, engine process {r['engine_rss_gib']:.2f}); fp32 weights "
              f"{r['weights_gib_per_rank']:.2f} + KV {r['kv_gib_per_rank']:.3f} GiB per rank")
    one, two = results[1], results[2]
    print(f"ratios TP=2/TP=1 ({weight_format}): batched {two['batched_tok_s'] / one['batched_tok_s']:.2f}x, "
          f"single stream {two['decode_tok_s'] / one['decode_tok_s']:.2f}x, largest rank RSS "
          f"{max(two['rss_gib']) / max(one['rss_gib']):.2f}x")


if __name__ == "__main__":
    main()
