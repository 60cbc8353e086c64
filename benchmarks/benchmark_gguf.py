"""Our engine against llama.cpp on the same random-weight GGUF file: throughput, load time, peak memory.

    python benchmarks/benchmark_gguf.py --shape ernie-21b-a3b --quant Q4_K_M [--engines ours,llamacpp]

The file is gguf_checkpoints.py's (written once under --dir, default ~/.cache/fastdeploy-bench). Each
engine runs in a fresh child process of this run, one after the other (never side by side: each gets
the machine's memory and cores):
  * load: seconds from the engine's constructor to ready, the file read into the page cache just before
    (read_into_page_cache), so both engines start from the same state (ours: `LLM(model=file)`, weights loaded, KV
    pool allocated; llama.cpp: model and context created, weights mapped, as benchmark_throughput's
    `engines_optional.LlamaCpp`);
  * batch: N prompts (random token ids, 42 each, the same for both engines) x L new tokens in one
    call, greedy, EOS ignored; output tok/s = N * L / wall time (prefill included);
  * single stream: decode tok/s of one prompt, (L - 1) / (t_L - t_1) (benchmark_throughput.run_once);
  * RSS: the child's resident memory after load, and its peak over the whole run (VmHWM: the weights,
    mapped file pages that were read included, the KV cache, the activations).
Ratios ours / llama.cpp follow the table. llama.cpp uses its own quantized kernels on the file's blocks;
its AMX weight repacking is off (engines_optional.LlamaCpp: it crashes on some Xeons), so it runs its
AVX-512 (or AVX2) path; the child prints which CPU features its build uses. Both engines use one thread
per usable core. The weights are random, so tokens are not compared (the engines round differently).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchmark_throughput  # this script's folder is on sys.path; imports neither paddle nor torch
import engines_optional
import gguf_checkpoints

ENGINES = ("ours", "llamacpp")
PROMPT_TOKENS = 42


def status_bytes(key: str) -> int:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def prompts_for(vocab: int, n: int) -> list[list[int]]:
    """n fixed random prompts of PROMPT_TOKENS ids, clear of the byte tokens and the special tokens at the end."""
    import numpy as np

    return np.random.default_rng(0).integers(256, vocab - 2, size=(n, PROMPT_TOKENS)).tolist()


def llama_cpp_path(llama_cpp) -> str:
    """The wide-vector / tile features llama.cpp's build uses here (from llama_print_system_info)."""
    info = llama_cpp.llama_print_system_info().decode()
    used = [part.split("=")[0].strip() for part in info.split("|") if part.strip().endswith("= 1")]
    wide = [f for f in used if f.startswith(("AVX512", "AMX"))] or [f for f in used if f.startswith("AVX")]
    return f"llama.cpp CPU path {'+'.join(wide)}, AMX repacking off"


def child(args) -> None:
    """Load one engine, measure it, print one RESULT line."""
    prompts = json.loads(Path(args.prompts_file).read_text())
    threads = len(os.sched_getaffinity(0))
    start = time.perf_counter()
    if args.child == "ours":
        engine = benchmark_throughput.Ours(args.model, len(prompts))
    else:
        engine = engines_optional.LlamaCpp(args.model, len(prompts), PROMPT_TOKENS + args.output_len + 8, threads)
    load = time.perf_counter() - start
    rss_loaded = status_bytes("VmRSS")
    if args.child == "ours":
        weights = benchmark_throughput.ours_weight_format(engine.llm.llm_engine.executor.runner.model, args.model)
    else:
        weights = f"gguf {benchmark_throughput.gguf_type(args.model)}; {llama_cpp_path(engine.lc)}"
    benchmark_throughput.timed(engine, prompts, 2)  # warm-up
    res = benchmark_throughput.run_once(engine, prompts, args.output_len, True, 0)
    print("RESULT " + json.dumps({"engine": args.child, "weights": weights, "load_s": load, "batch": res["batch"],
                                  "single": res.get("single"), "rss_loaded": rss_loaded,
                                  "rss_peak": max(status_bytes("VmHWM"),
                                                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}),
          flush=True)


def read_into_page_cache(path: Path, chunk: int = 64 << 20) -> None:
    """Read the whole file once, so each engine's load starts with the file in the page cache (as after a
    first run) and its load time measures the engine, not the disk."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        while f.readinto(buf):
            pass


def run_child(engine: str, args, path: Path, prompts_file: str) -> dict:
    read_into_page_cache(path)
    cmd = [sys.executable, __file__, "--child", engine, "--model", str(path), "--prompts-file", prompts_file,
           "--output-len", str(args.output_len)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=benchmark_throughput.ENV_AT_START)
    result = benchmark_throughput.child_result(proc)
    if result is None:
        sys.exit(f"{engine} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    print("\n".join(line for line in proc.stdout.splitlines() if line.startswith("  run ")), flush=True)
    result["wall_s"] = time.perf_counter() - start
    return result


def report(results: dict, args, path: Path) -> None:
    gib = 2 ** 30
    print(f"\n=== {path.name} ({path.stat().st_size / gib:.2f} GiB): {args.num_prompts} prompts x {args.output_len} "
          f"new tokens, greedy, EOS ignored; {len(os.sched_getaffinity(0))} threads ===")
    print(f"{'engine':<10}{'batch tok/s':>12}{'single tok/s':>14}{'load s':>9}{'RSS loaded GiB':>16}"
          f"{'peak RSS GiB':>14}{'run s':>8}  weights")
    for name, r in results.items():
        print(f"{name:<10}{r['batch']:>12.1f}{benchmark_throughput.fmt(r['single']):>14}{r['load_s']:>9.1f}"
              f"{r['rss_loaded'] / gib:>16.2f}{r['rss_peak'] / gib:>14.2f}{r['wall_s']:>8.0f}  {r['weights']}")
    if set(ENGINES) <= set(results):
        ours, other = results["ours"], results["llamacpp"]
        single = (f"{ours['single'] / other['single']:.2f}x" if ours["single"] and other["single"] else "-")
        print(f"ours / llama.cpp: batch {ours['batch'] / other['batch']:.2f}x, single stream {single}, "
              f"load time {ours['load_s'] / other['load_s']:.2f}x, peak RSS {ours['rss_peak'] / other['rss_peak']:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(gguf_checkpoints.SHAPES), default="ernie-21b-a3b")
    ap.add_argument("--quant", choices=sorted(gguf_checkpoints.QUANTS), default="Q4_K_M")
    ap.add_argument("--dir", default=str(gguf_checkpoints.DEFAULT_DIR), help="folder of the GGUF files")
    ap.add_argument("--engines", default="ours,llamacpp", help=f"comma-separated subset of {','.join(ENGINES)}")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--prompts-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    names = benchmark_throughput.engine_names(args.engines, ENGINES)
    path = gguf_checkpoints.checkpoint(args.shape, args.quant, Path(args.dir))
    prompts = prompts_for(gguf_checkpoints.SHAPES[args.shape]["vocab"], args.num_prompts)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    try:
        results = {n: run_child(n, args, path, f.name) for n in names}
    finally:
        os.unlink(f.name)
    report(results, args, path)


if __name__ == "__main__":
    main()
