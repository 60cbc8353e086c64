"""What tensor and pipeline parallelism cost and save here, on the default model and on a random
checkpoint of ERNIE-4.5-0.3B's shapes (written once by benchmark_load_ernie.py's writer), in each
weight format of `--formats` (every rank packs its own shard, so the format is kept):
  * bfloat16 (the default): `dtype="bfloat16"` (the GGUF model: its blocks dequantized to bf16);
  * float32: `dtype="float32"` (the GGUF model: its blocks, as stored);
  * wint8, wint4: `quantization=...` (float checkpoints only: skipped for the GGUF model).

`--configs` picks the parallel layouts, comma-separated (all by default):
  * tp1: one process (P = 1, T = 1), the baseline every ratio line divides by;
  * tp2: `tensor_parallel_size=2`;
  * pp2, pp3: `pipeline_parallel_size=2` / `3`;
  * pp2tp2: `pipeline_parallel_size=2, tensor_parallel_size=2` (four ranks);
  * pp2-nodes: P = 2 as two local "nodes" over loopback: the engine with `nnodes=2` runs stage 0,
    a `python -m fastdeploy.worker.tp_node --node-rank 1` process (started by the child) stage 1,
    each node on half the cores (CPU affinity), as two machines would be.
Every layout but tp1 computes in worker processes, a node's cores split between its ranks; so pp2
and pp2-nodes compute alike and differ in how steps and hidden states travel (local sockets
against the nodes' TCP links).

Each configuration runs in a fresh child process and reports:
  * start-up: wall time of LLM(...);
  * batched output tok/s: B prompts x L new tokens, greedy, EOS ignored, one generate;
  * single-stream decode tok/s: (L - 1) / (t_L - t_1) for one prompt;
  * collective time per step on each rank (tensor parallelism's all-reduces, the logits all-gather
    and the token broadcast; waiting for the slower rank included), from the workers' own counters
    (TensorParallelGroup.comm_seconds) over the single-stream runs, against the step time;
  * pipeline traffic, from the workers' PipelineStage counters: the bytes each rank sends the next
    stage per model step (hidden states), averaged over the batched run (its prefill step included)
    and per single-stream decode step (one token: the L-token run less the 1-token run, over L - 1
    steps), and each rank's wait for the previous stage per single-stream decode step;
  * resident memory of each process that holds weights (the engine for tp1, each rank otherwise,
    other nodes' included) after the runs, beside a bare process's (imports only), the bytes of the
    parameters each such process holds (as held: packed weights as their buffers), and the model's
    fp32 weight and KV-cache bytes divided by the rank count.
Then, per model and format, each layout against tp1: batched and single-stream tok/s, the largest
rank's parameter bytes and resident memory.

    python benchmarks/benchmark_tensor_parallel.py [--models smollm,ernie] [--formats bfloat16,float32,wint8,wint4]
        [--configs tp1,tp2,pp2,pp3,pp2tp2,pp2-nodes] [--batch 8] [--tokens 32]
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
GiB, KiB = 2**30, 2**10
FORMATS = {"bfloat16": dict(dtype="bfloat16"), "float32": dict(dtype="float32"),
           "wint8": dict(quantization="wint8"), "wint4": dict(quantization="wint4")}
# name: (pipeline_parallel_size, tensor_parallel_size, nnodes)
CONFIGS = {"tp1": (1, 1, 1), "tp2": (1, 2, 1), "pp2": (2, 1, 1), "pp3": (3, 1, 1), "pp2tp2": (2, 2, 1),
           "pp2-nodes": (2, 1, 2)}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def node_cores(nnodes: int) -> list[set]:
    """This process's cores cut into `nnodes` equal parts, one per local node (all of them for each
    when there are fewer cores than nodes)."""
    cores = sorted(os.sched_getaffinity(0))
    n = len(cores) // nnodes
    return [set(cores[i * n:(i + 1) * n]) for i in range(nnodes)] if n else [set(cores)] * nnodes


def start_other_node(pp: int, tp: int, port: int, cores: set) -> subprocess.Popen:
    """Node 1 of two on this machine, on `cores`: `python -m fastdeploy.worker.tp_node`, this checkout's code."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "fastdeploy.worker.tp_node", "--tensor-parallel-size", str(tp),
                             "--pipeline-parallel-size", str(pp), "--nnodes", "2", "--node-rank", "1",
                             "--master-addr", "127.0.0.1", "--master-port", str(port)], env=env,
                            preexec_fn=lambda: os.sched_setaffinity(0, cores))


def child(model: str, config: str, weight_format: str, batch: int, tokens: int) -> dict:
    pp, tp, nnodes = CONFIGS[config]
    cores = node_cores(nnodes)
    os.sched_setaffinity(0, cores[0])  # node 0's share: the engine's ranks size their threads from it
    import fastdeploy  # noqa: F401  (first: CPU environment before paddle)
    from fastdeploy.executor.multiproc import free_port

    if nnodes == 1:
        return measure(model, pp, tp, {}, weight_format, batch, tokens)
    port = free_port("127.0.0.1")
    node = start_other_node(pp, tp, port, cores[1])
    try:
        return measure(model, pp, tp, dict(nnodes=nnodes, master_port=port), weight_format, batch, tokens)
    finally:
        try:
            node.wait(30)  # it exits once the engine shut down
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()


def measure(model: str, pp: int, tp: int, nodes: dict, weight_format: str, batch: int, tokens: int) -> dict:
    from fastdeploy import LLM, SamplingParams
    from fastdeploy.worker.tp_worker import parameter_bytes

    bare = rss_bytes()
    start = time.perf_counter()
    llm = LLM(model=model, tensor_parallel_size=tp, pipeline_parallel_size=pp, max_model_len=512,
              max_num_seqs=batch, num_gpu_blocks_override=KV_BLOCKS, block_size=BLOCK_SIZE,
              enable_prefix_caching=False, **nodes, **FORMATS[weight_format])
    startup = time.perf_counter() - start
    try:
        steps = [0]  # model steps whose results came back
        scheduler = llm.llm_engine.scheduler
        update = scheduler.update_from_output

        def counted(*args, **kwargs):
            steps[0] += 1
            return update(*args, **kwargs)

        scheduler.update_from_output = counted
        executor = llm.llm_engine.executor
        workers = pp * tp > 1
        prompts = [{"prompt_token_ids": list(range(100 + 7 * i, 132 + 7 * i))} for i in range(batch)]

        def run(n, count):
            t = time.perf_counter()
            llm.generate(prompts[:count], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
                         use_tqdm=False)
            return time.perf_counter() - t

        def stats():
            return executor.worker_stats() if workers else []

        def per_step(before, after, field, scale):
            return [(getattr(a, field) - getattr(b, field)) / scale / steps[0] for b, a in zip(before, after)]

        run(2, batch)  # warm-up
        s0, steps[0] = stats(), 0
        batched = batch * tokens / run(tokens, batch)
        s1 = stats()
        sent_batched = per_step(s0, s1, "pipeline_bytes_sent", KiB)
        steps[0] = 0
        t1 = run(1, 1)
        s_prefill = stats()
        t_l = run(tokens, 1)
        step_s = (t1 + t_l) / steps[0]
        s2 = stats()

        def per_decode_step(field, scale):  # the L-token run less the 1-token run: its L - 1 decode steps
            return [(getattr(c, field) - 2 * getattr(b, field) + getattr(a, field)) / scale / (tokens - 1)
                    for a, b, c in zip(s1, s_prefill, s2)]
        config = llm.llm_engine.config
        mc = config.model_config
        ranks = pp * tp
        return {
            "startup_s": startup, "batched_tok_s": batched, "decode_tok_s": (tokens - 1) / (t_l - t1),
            "step_ms": 1000 * step_s,
            "comm_ms_per_step": per_step(s1, s2, "comm_seconds", 1e-3) if tp > 1 else [],
            "stages": [s.stage for s in s2],
            "sent_kib_per_step_batched": sent_batched if pp > 1 else [],
            "sent_kib_per_decode_step": per_decode_step("pipeline_bytes_sent", KiB) if pp > 1 else [],
            "recv_wait_ms_per_decode_step": per_decode_step("pipeline_recv_seconds", 1e-3) if pp > 1 else [],
            "rss_gib": [s.resident_bytes / GiB for s in s2] if workers else [rss_bytes() / GiB],
            "params_gib": ([s.parameter_bytes / GiB for s in s2] if workers
                           else [parameter_bytes(executor.runner.model) / GiB]),
            "engine_rss_gib": rss_bytes() / GiB, "bare_rss_gib": bare / GiB,
            "weights_gib_per_rank": mc.weight_bytes() / ranks / GiB,
            "kv_gib_per_rank": KV_BLOCKS * BLOCK_SIZE * mc.kv_bytes_per_token() / ranks / GiB,
        }
    finally:
        llm.shutdown()


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


def choices(parser, option: str, value: str, allowed) -> list[str]:
    """The comma-separated `value` of `option`, every item one of `allowed` (else a usage error)."""
    items = value.split(",")
    unknown = sorted(set(items) - set(allowed))
    if unknown:
        parser.error(f"{option}: {unknown} unknown; choose from {list(allowed)}")
    return items


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm,ernie")
    parser.add_argument("--formats", default="bfloat16", help=f"comma-separated, of {sorted(FORMATS)}")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {list(CONFIGS)}")
    parser.add_argument("--ernie-dir", default="/tmp/ernie-0.3b-random")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "CONFIG", "FORMAT"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.child[2], args.batch, args.tokens)))
        return
    formats = choices(parser, "--formats", args.formats, FORMATS)
    configs = choices(parser, "--configs", args.configs, CONFIGS)
    print(f"load average at start: {os.getloadavg()}, cores: {len(os.sched_getaffinity(0))}")
    failed = []
    for label, path in model_paths(args.models.split(","), Path(args.ernie_dir)).items():
        for weight_format in formats:
            if path.endswith(".gguf") and weight_format.startswith("wint"):
                print(f"=== {label}: {weight_format} skipped (quantization applies to float checkpoints) ===")
                continue
            failed += report(label, path, weight_format, configs, args)
    print(f"load average at end: {os.getloadavg()}")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


def describe(config: str) -> str:
    pp, tp, nnodes = CONFIGS[config]
    return f"P={pp} T={tp}" + (f" on {nnodes} local nodes" if nnodes > 1 else "")


def listed(values: list, fmt: str = ".1f") -> str:
    return ", ".join(f"{v:{fmt}}" for v in values) or "-"


def report(label: str, path: str, weight_format: str, configs: list[str], args) -> list[str]:
    """Run each configuration of one model in one format, each in a fresh process, and print their
    rows, then each one's ratios to tp1 when tp1 ran; returns the failed runs' names (their errors
    printed, the others still run)."""
    held = {"float32": " (its blocks as stored)", "bfloat16": " (blocks dequantized)"} if path.endswith(".gguf") else {}
    print(f"=== {label}, {weight_format}{held.get(weight_format, '')}: batch {args.batch} x {args.tokens} tokens, "
          f"{KV_BLOCKS} KV blocks of {BLOCK_SIZE} ===")
    results, failed = {}, []
    for config in configs:
        out = subprocess.run([sys.executable, __file__, "--child", path, config, weight_format,
                              "--batch", str(args.batch), "--tokens", str(args.tokens)],
                             env=ENV_AT_START, capture_output=True, text=True)
        if out.returncode:
            failed.append(f"{config} {weight_format} on {label}")
            print(f"{config} ({describe(config)}) {weight_format} on {label} failed:\n{out.stderr[-3000:]}")
            continue
        results[config] = json.loads(out.stdout.strip().splitlines()[-1])
    for config, r in results.items():
        pipeline = ""
        if r["sent_kib_per_step_batched"]:
            pipeline = (f"; sent to the next stage per step, per rank (stages {listed(r['stages'], 'd')}): batched "
                        f"{listed(r['sent_kib_per_step_batched'])} KiB, single-stream decode "
                        f"{listed(r['sent_kib_per_decode_step'], '.2f')} KiB, waiting for the previous stage "
                        f"{listed(r['recv_wait_ms_per_decode_step'])} ms per single-stream decode step")
        print(f"{config} ({describe(config)}): start-up {r['startup_s']:.1f} s, batched "
              f"{r['batched_tok_s']:.1f} tok/s, single stream {r['decode_tok_s']:.1f} tok/s ({r['step_ms']:.1f} ms/step, collectives "
              f"{listed(r['comm_ms_per_step'])} ms/step per rank){pipeline}; RSS per process holding weights "
              f"{listed(r['rss_gib'], '.2f')} GiB (parameters {listed(r['params_gib'], '.3f')} GiB; bare process "
              f"{r['bare_rss_gib']:.2f}, engine process {r['engine_rss_gib']:.2f}); fp32 weights "
              f"{r['weights_gib_per_rank']:.2f} + KV {r['kv_gib_per_rank']:.3f} GiB per rank")
    one = results.get("tp1")
    for config, r in results.items():
        if one is None or config == "tp1":
            continue
        print(f"ratios {config}/tp1 ({weight_format}): batched {r['batched_tok_s'] / one['batched_tok_s']:.2f}x, "
              f"single stream {r['decode_tok_s'] / one['decode_tok_s']:.2f}x, largest rank's parameters "
              f"{max(r['params_gib']) / max(one['params_gib']):.2f}x, largest rank RSS "
              f"{max(r['rss_gib']) / max(one['rss_gib']):.2f}x")
    return failed


if __name__ == "__main__":
    main()
