"""run-batch against calling LLM.generate directly, on the same 1,000 short requests.

Each mode runs in a fresh child process and is timed end to end (model load included, the same for
both single-process modes):
  direct      LLM(**engine) then one LLM.generate over every prompt (results kept in memory)
  run-batch   fastdeploy.entrypoints.batch.runner.run_job on a JSONL file of the same requests
              (parse, windows of requests into the engine, each answer appended to the output file)
  ray-dpN     run_job with --data-parallel-size N (local Ray instance; Ray start-up and N model loads
              included), when --data-parallel-size > 1 and ray is installed
Requests: completions of short prompts, greedy, `max_tokens` new tokens with EOS ignored (so every
mode generates the same number of tokens). Prints tok/s per mode and the ratio run-batch/direct.

    python benchmarks/benchmark_run_batch.py                       # 1000 requests x 16 tokens, direct and run-batch
    python benchmarks/benchmark_run_batch.py --data-parallel-size 2 --repeats 2
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
WORDS = ["river", "mountain", "library", "garden", "engine", "market", "planet", "violin", "harbor", "desert"]


def prompts(n: int) -> list[str]:
    return [f"Tell me one fact about the {WORDS[i % len(WORDS)]} number {i}." for i in range(n)]


def engine_kwargs(args) -> dict:
    return {"model": args.model, "max_model_len": 512, "max_num_seqs": args.max_num_seqs}


def child(args) -> None:
    """One mode in this fresh process; prints `RESULT {...}`."""
    texts = prompts(args.num_requests)
    start = time.perf_counter()
    if args.child == "direct":
        from fastdeploy import LLM, SamplingParams

        llm = LLM(**engine_kwargs(args))
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
        outs = llm.generate(texts, params, use_tqdm=False)
        tokens = sum(len(o.outputs.token_ids) for o in outs)
    else:
        from fastdeploy.entrypoints.batch.runner import run_job

        with tempfile.TemporaryDirectory() as tmp:
            inp, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
            body = {"max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
            inp.write_text("".join(json.dumps({"custom_id": f"r{i}", "url": "/v1/completions",
                                               "body": {**body, "prompt": t}}) + "\n" for i, t in enumerate(texts)))
            dp = 1 if args.child == "run-batch" else args.data_parallel_size
            summary = run_job(str(inp), str(out), engine_kwargs(args), data_parallel_size=dp, use_tqdm=False)
            assert summary.done == len(texts), summary
            tokens = summary.completion_tokens
    seconds = time.perf_counter() - start
    print("RESULT " + json.dumps({"mode": args.child, "seconds": seconds, "tokens": tokens}), flush=True)


def run_child(mode: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--num-requests", str(args.num_requests),
           "--max-tokens", str(args.max_tokens), "--max-num-seqs", str(args.max_num_seqs),
           "--data-parallel-size", str(args.data_parallel_size)] + (["--model", args.model] if args.model else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{mode} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    print(f"  run {mode}: {result['tokens'] / result['seconds']:.1f} tok/s ({result['seconds']:.1f} s)", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--data-parallel-size", type=int, default=1, help="also run ray-dpN when > 1")
    ap.add_argument("--repeats", type=int, default=1, help="alternating runs per mode; the best is reported")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    modes = ["direct", "run-batch"] + ([f"ray-dp{args.data_parallel_size}"] if args.data_parallel_size > 1 else [])
    results = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:
            results[mode].append(run_child(mode if not mode.startswith("ray") else "ray", args))
    best = {m: max(r["tokens"] / r["seconds"] for r in runs) for m, runs in results.items()}
    print(f"\n=== {args.num_requests} requests x {args.max_tokens} tokens, max_num_seqs {args.max_num_seqs}, "
          f"best of {args.repeats}, each run end to end in its own process (model load included) ===")
    for mode in modes:
        print(f"{mode:<12}{best[mode]:>10.1f} tok/s")
    for mode in modes[1:]:
        print(f"ratio {mode}/direct: {best[mode] / best['direct']:.3f}")


if __name__ == "__main__":
    main()
