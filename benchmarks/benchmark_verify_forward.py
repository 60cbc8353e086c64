"""What verifying k draft tokens costs: the model's forward of n = k + 1 new tokens per request on a cached
context, against n = 1 (a decode step).

Builds our engine on the default model (or --model), fills the KV cache of --batch requests with a
--context-token prefill, then times, for each n of --tokens, the model's forward of n new tokens per request
(each a multi-token decode item of the attention op, its KV written after the context) plus the logits of
every new row (verification scores each position), best of --repeats, and prints ms and the ratio to n = 1.
Only the model: no scheduler, sampler or Python step around it (those are per step, not per row).

    python benchmarks/benchmark_verify_forward.py [--tokens 1,2,4,5,8] [--context 256] [--batch 1]
        [--repeats 30] [--model PATH] [--dtype auto] [--quantization wint8]
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def forward_timer(llm, batch: int, context: int, most_tokens: int):
    """time(n) -> best seconds of one forward + logits of n new tokens per request after `context` cached ones."""
    import paddle

    from fastdeploy.model_executor.forward_meta import ForwardMeta
    from fastdeploy.model_executor.host_arrays import as_paddle

    runner = llm.llm_engine.executor.runner
    model, caches, block_size = runner.model, runner.kv_caches, runner.block_size
    per_request = -(-(context + most_tokens) // block_size)
    tables = [list(range(1 + i * per_request, 1 + (i + 1) * per_request)) for i in range(batch)]  # unused by the idle engine
    vocab = llm.get_tokenizer().vocab_size
    rng = np.random.default_rng(0)

    def forward(n: int, start: int):
        meta = ForwardMeta.build([n] * batch, [start] * batch, tables, block_size, caches)
        ids = as_paddle(rng.integers(0, vocab, n * batch, dtype=np.int64))
        positions = as_paddle(np.tile(np.arange(start, start + n, dtype=np.int64), batch))
        with paddle.no_grad():
            return model.compute_logits(model(ids, positions, meta, None))

    forward(context, 0)  # the context's KV

    def time_n(n: int, repeats: int) -> float:
        forward(n, context)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            forward(n, context)
            best = min(best, time.perf_counter() - start)
        return best

    return time_n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", default="1,2,4,5,8", help="new tokens per request, n = k + 1")
    ap.add_argument("--context", type=int, default=256, help="cached tokens per request")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--quantization", default=None, choices=["wint8", "wint4"])
    args = ap.parse_args()
    tokens = [int(n) for n in args.tokens.split(",")]
    if any(n < 1 for n in tokens) or args.context < 1 or args.batch < 1:
        sys.exit(f"--tokens, --context and --batch must be positive, got {args.tokens!r}, {args.context}, {args.batch}")
    from fastdeploy import LLM  # first: fastdeploy prepares the environment for paddle

    llm = LLM(model=args.model, max_num_seqs=args.batch, max_model_len=args.context + max(tokens) + 16,
              dtype=args.dtype, quantization=args.quantization)
    time_n = forward_timer(llm, args.batch, args.context, max(tokens))
    times = {n: time_n(n, args.repeats) for n in tokens}
    base = times.get(1) or time_n(1, args.repeats)
    print(f"batch {args.batch}, context {args.context}, best of {args.repeats}")
    print(f"{'new tokens':>10} {'ms':>8} {'ratio to 1':>10}")
    for n, t in times.items():
        print(f"{n:>10} {t * 1e3:>8.2f} {t / base:>10.2f}")


if __name__ == "__main__":
    main()
