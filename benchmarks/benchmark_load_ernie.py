"""Loading and decoding a random checkpoint with ERNIE-4.5-0.3B's real shapes: ours vs transformers.

The checkpoint (hidden 1024, 18 layers, 16 heads / 2 KV heads of 128, intermediate 3072, vocab
103424, tied embeddings, bf16 safetensors like baidu/ERNIE-4.5-0.3B-PT) is written once by
transformers into --dir. Then, each in a fresh child process (Paddle and torch slow each other in
one process), for our engine and for transformers (float32):
  * load time: wall time of `LLM(model=dir)` / `from_pretrained(dir, dtype=float32)`;
  * peak memory while loading: the process's peak RSS after loading minus its RSS before (imports
    done), against the model's fp32 size;
  * single-stream decode tok/s: (L - 1) / (t_L - t_1) for L = 64 new tokens, greedy, EOS ignored.

    python benchmarks/benchmark_load_ernie.py [--dir /tmp/ernie-0.3b-random]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV_AT_START = dict(os.environ)
SHAPES = dict(vocab_size=103424, hidden_size=1024, intermediate_size=3072, num_hidden_layers=18,
              num_attention_heads=16, num_key_value_heads=2, head_dim=128, max_position_embeddings=131072,
              rope_theta=500000.0, rms_norm_eps=1e-5, use_bias=False, tie_word_embeddings=True,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
PROMPT = list(range(1000, 1032))
NEW_TOKENS = 64


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def write_checkpoint(path: Path) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Ernie4_5Config, Ernie4_5ForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = Ernie4_5Config(**{k: v for k, v in SHAPES.items() if k != "rope_theta"},
                            rope_parameters={"rope_type": "default", "rope_theta": SHAPES["rope_theta"]})
    model = Ernie4_5ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(path))
    vocab = {f"<t{i}>": i for i in range(SHAPES["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<t0>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<t2>", bos_token="<t1>").save_pretrained(str(path))


def child(engine: str, path: str) -> dict:
    if engine == "ours":
        import fastdeploy  # noqa: F401  (first: CPU environment before paddle)
        from fastdeploy import LLM, SamplingParams

        before = rss_bytes()
        start = time.perf_counter()
        llm = LLM(model=path, max_model_len=256, max_num_seqs=4, enable_prefix_caching=False)
        load = time.perf_counter() - start

        def run(n):
            t = time.perf_counter()
            llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
                         use_tqdm=False)
            return time.perf_counter() - t
    else:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(len(os.sched_getaffinity(0)))
        before = rss_bytes()
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        load = time.perf_counter() - start
        ids = torch.tensor([PROMPT])

        def run(n):
            t = time.perf_counter()
            with torch.no_grad():
                model.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n)
            return time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    run(2)  # warm-up
    decode = (NEW_TOKENS - 1) / (run(NEW_TOKENS) - run(1))
    return {"load_s": load, "peak_load_gib": peak / 2**30, "decode_tok_s": decode}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/tmp/ernie-0.3b-random")
    parser.add_argument("--child", choices=["ours", "transformers"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.dir)))
        return
    path = Path(args.dir)
    if not (path / "config.json").is_file():
        write_checkpoint(path)
    params = sum(os.path.getsize(p) for p in path.glob("*.safetensors")) / 2  # bf16 on disk
    results = {}
    for engine in ("ours", "transformers"):
        out = subprocess.run([sys.executable, __file__, "--dir", str(path), "--child", engine], env=ENV_AT_START,
                             capture_output=True, text=True, check=True)
        results[engine] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"=== random ERNIE-4.5-0.3B shapes ({params / 1e6:.0f} M params, fp32 size {params * 4 / 2**30:.2f} GiB) ===")
    print(f"{'engine':14s} {'load s':>8s} {'peak load GiB':>14s} {'decode tok/s':>13s}")
    for engine, r in results.items():
        print(f"{engine:14s} {r['load_s']:8.1f} {r['peak_load_gib']:14.2f} {r['decode_tok_s']:13.1f}")
    ours, hf = results["ours"], results["transformers"]
    print(f"ratio ours/transformers: load time {ours['load_s'] / hf['load_s']:.2f}x, "
          f"peak load memory {ours['peak_load_gib'] / hf['peak_load_gib']:.2f}x, decode {ours['decode_tok_s'] / hf['decode_tok_s']:.2f}x")


if __name__ == "__main__":
    main()
