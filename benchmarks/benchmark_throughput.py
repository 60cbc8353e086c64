"""Offline throughput: this engine against HF transformers (torch CPU, fp32), same weights, one process.

Workload (see /work/shared/ANCHORS.md): N short chat questions rendered with the model's chat
template by our tokenizer (~40 tokens each), x L new tokens, greedy, EOS ignored. Both engines get
the same prompt token ids.

Measured per engine:
  * batched: all N prompts in one call (ours: `LLM.generate`, max_num_seqs=N; transformers:
    one batched `generate`, left padding with pad = EOS, `min_new_tokens=L` so EOS cannot end a
    row). Output tok/s = N*L / wall time of the call (prefill included, end to end).
  * single stream: one prompt. Decode tok/s excludes prefill: the same prompt is generated with
    max_tokens=L and with max_tokens=1, and decode tok/s = (L-1) / (t_L - t_1). The difference
    removes prefill, the first token and any fixed per-call overhead, and is measured the same way
    for both engines (no reliance on either engine's internal timers).
  * GFLOP/s = 2 x matmul params (all linear layers + lm_head; embedding lookup and attention
    score FLOPs left out) x tokens / s, where tokens = prompt + generated tokens for the batched
    run (prefill costs FLOPs too) and the L-1 decode tokens for single stream.

Both engines use the same number of threads: one per usable core (our engine does this itself;
torch gets `torch.set_num_threads`). Each run happens in a fresh child process of this one
script run: Paddle (Intel OpenMP) and torch (GNU OpenMP) in one process keep each other's spinning
worker threads on the same two cores and halve each other's speed. Each engine is warmed up once
(a short batched generate) before timing. With --repeats R the engines alternate (ours, hf, ours,
hf, ...) and the best run of each is reported (noise on a shared machine only slows a run down);
every run is printed too.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def build_prompts(tokenizer, n):
    """n chat prompts (questions cycled) as token ids, rendered with the model's chat template."""
    prompts = []
    for i in range(n):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


def matmul_params(cfg):
    """Weights used by matmuls per token (works on our ModelConfig and on a transformers config)."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, (cfg.num_key_value_heads or cfg.num_attention_heads) * hd
    layer = h * (q + 2 * kv) + q * h + 3 * h * inter
    return cfg.num_hidden_layers * layer + cfg.vocab_size * h


class Ours:
    name = "ours (paddle)"

    def __init__(self, path, n):
        from fastdeploy import LLM  # first: fastdeploy sets MKL_DEBUG_CPU_TYPE before paddle loads

        self.llm = LLM(model=path, max_num_seqs=n, max_model_len=1024)
        self.tokenizer = self.llm.get_tokenizer()
        self.params = matmul_params(self.llm.llm_engine.config.model_config)

    def generate(self, prompts, n_new):
        from fastdeploy import SamplingParams

        sp = SamplingParams(temperature=0, max_tokens=n_new, ignore_eos=True)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return [list(o.outputs.token_ids) for o in outs]


class HF:
    name = "transformers (torch fp32)"

    def __init__(self, path, threads):
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.set_num_threads(threads)
        p = Path(path)
        kw = {"gguf_file": p.name} if p.is_file() else {}
        self.model = AutoModelForCausalLM.from_pretrained(str(p.parent if p.is_file() else p),
                                                          dtype=torch.float32, **kw).eval()
        self.eos = self.model.generation_config.eos_token_id
        self.eos = self.eos[0] if isinstance(self.eos, list) else self.eos
        self.params = matmul_params(self.model.config)
        self.torch = torch

    def generate(self, prompts, n_new):
        torch, width = self.torch, max(len(p) for p in prompts)
        ids = torch.tensor([[self.eos] * (width - len(p)) + p for p in prompts])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                      max_new_tokens=n_new, min_new_tokens=n_new, pad_token_id=self.eos)
        return out[:, width:].tolist()


def busy_others():
    """CPU seconds used so far by everything on the machine, minus this process (from /proc/stat)."""
    with open("/proc/stat") as f:
        ticks = list(map(int, f.readline().split()[1:]))
    own = os.times()
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK") - own.user - own.system


def timed(engine, prompts, n_new, load=None):
    """(seconds, outputs) of one generate call; adds other processes' CPU seconds to load[0]."""
    others, start = busy_others(), time.perf_counter()
    outs = engine.generate(prompts, n_new)
    elapsed = time.perf_counter() - start
    if load is not None:
        load[0] += busy_others() - others
    assert all(len(o) == n_new for o in outs), f"{engine.name}: output lengths {sorted({len(o) for o in outs})} != {n_new}"
    return elapsed, outs


def run_once(engine, prompts, n_new, single):
    """One measurement: batched output tok/s, and single-stream decode tok/s (or None)."""
    load = [0.0]
    t, outs = timed(engine, prompts, n_new, load)
    tokens = sum(map(len, prompts)) + len(prompts) * n_new  # prefill + decode tokens
    res = {"batch": len(prompts) * n_new / t, "batch_gflops": 2 * engine.params * tokens / t / 1e9, "outs": outs}
    if single:
        t_l, _ = timed(engine, prompts[:1], n_new, load)
        t_1, _ = timed(engine, prompts[:1], 1, load)
        res["single"] = (n_new - 1) / max(t_l - t_1, 1e-9)
        res["single_gflops"] = 2 * engine.params * res["single"] / 1e9
    print(f"  run {engine.name}: batch {res['batch']:.1f} tok/s ({t:.2f} s)"
          + (f", single decode {res['single']:.1f} tok/s" if single else "")
          + f"; other processes used {load[0]:.1f} CPU-s meanwhile", flush=True)
    return res


def best(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return max(vals) if vals else None


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def report(names, results, args, prompts):
    print(f"\n=== {args.num_prompts} prompts (mean {sum(map(len, prompts)) / len(prompts):.1f} tokens) "
          f"x {args.output_len} new tokens, greedy, EOS ignored; {args.threads} threads; "
          f"best of {args.repeats}; each run in its own process ===")
    print(f"{'engine':<28}{'batch tok/s':>12}{'GFLOP/s':>9}{'single tok/s':>14}{'GFLOP/s':>9}")
    summary = {}
    for n in names:
        runs = results[n]
        b, s = best(runs, "batch"), best(runs, "single")
        summary[n] = (b, s)
        print(f"{runs[0]['name']:<28}{fmt(b):>12}{fmt(best(runs, 'batch_gflops')):>9}{fmt(s):>14}"
              f"{fmt(best(runs, 'single_gflops')):>9}")
    if len(names) == 2:
        (b0, s0), (b1, s1) = summary["ours"], summary["hf"]
        print(f"ratio ours/transformers: batch {b0 / b1:.2f}x"
              + (f", single stream {s0 / s1:.2f}x" if s0 and s1 else ""))
        a, b = results["ours"][0]["outs"], results["hf"][0]["outs"]
        # transformers' min_new_tokens masks EOS; ours (ignore_eos) may emit it: compare before it
        eos = results["hf"][0]["eos"]
        cut = [min([16] + [i for i, t in enumerate(x) if t == eos]) for x in a]
        same = sum(x[:k] == y[:k] for x, y, k in zip(a, b, cut))
        print(f"greedy agreement: {same}/{len(a)} prompts give the same tokens in both engines "
              "(first 16, or up to our first EOS)")
    print(f"matmul params: {results[names[0]][0]['params'] / 1e6:.1f} M")


ENGINES = {"ours": Ours, "hf": HF}


def child(args):
    """One engine, one measurement, in this fresh process; prints the result as one JSON line."""
    prompts = json.loads(Path(args.prompts_file).read_text())
    engine = Ours(args.model, len(prompts)) if args.child == "ours" else HF(args.model, args.threads)
    timed(engine, prompts, 2)  # warm-up: a short batched call
    res = run_once(engine, prompts, args.output_len, not args.skip_single and args.output_len > 1)
    res.update(name=engine.name, params=engine.params, eos=getattr(engine, "eos", None))
    print("RESULT " + json.dumps(res), flush=True)


def run_child(engine, args, prompts_file):
    cmd = [sys.executable, __file__, "--child", engine, "--prompts-file", prompts_file, "--model", args.model,
           "--output-len", str(args.output_len)] + (["--skip-single"] if args.skip_single else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV_AT_START)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{engine} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    print("\n".join(line for line in proc.stdout.splitlines() if line.startswith("  run ")), flush=True)
    return json.loads(lines[-1][len("RESULT "):])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help=".gguf file or HF directory (default: SmolLM2-135M-Instruct GGUF)")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--engines", default="ours,hf", help="comma-separated subset of ours,hf")
    ap.add_argument("--repeats", type=int, default=1, help="alternating runs per engine; the best is reported")
    ap.add_argument("--skip-single", action="store_true", help="skip the single-stream measurement")
    ap.add_argument("--child", choices=sorted(ENGINES), help=argparse.SUPPRESS)
    ap.add_argument("--prompts-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.threads = len(os.sched_getaffinity(0))
    if args.child:
        return child(args)
    from fastdeploy.model_executor.model_loader import open_model
    from fastdeploy.model_executor.model_loader.model_path import default_model_path, resolve_model_path

    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    assert names and set(names) <= set(ENGINES), f"--engines must be a subset of ours,hf, got {args.engines!r}"
    args.model = resolve_model_path(args.model) if args.model else default_model_path()
    prompts = build_prompts(open_model(args.model)[1].tokenizer, args.num_prompts)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    results = {n: [] for n in names}
    for _ in range(args.repeats):
        for n in names:  # alternate A B A B, each run in a fresh process
            results[n].append(run_child(n, args, f.name))
    os.unlink(f.name)
    report(names, results, args, prompts)


if __name__ == "__main__":
    main()
