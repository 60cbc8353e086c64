"""The compiled `append_attention` op on a batch of decodes: ms per step over all layers, per kernel.

ERNIE-4.5-0.3B's attention by default (16 query heads, 2 KV heads, head_dim 128, 18 layers, bf16 cache,
64-token blocks), a batch of decodes whose histories are drawn between --min-history and
--max-history (42 to 170: benchmark_throughput.py's 42-token prompts over their 128 new tokens). The
caches are where a decode step finds them:

    cold  every layer's cache, 600 MB read in between (a step streams ~700 MB of weights)
    warm  every layer's cache, nothing in between (what L3 holds)
    l2    one small cache shared by every request and layer (the kernels' own cost)

    python benchmarks/benchmark_decode_attention.py                 # kernels 0 (best) and 1 (no AMX)
    python benchmarks/benchmark_decode_attention.py --dtype float32 --batch 8

Only the op: where this sits in a whole step, profile_decode_step.py.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_inputs(args, rng, shared: bool):
    """(caches per layer, index tensors, qkv) for one decode step."""
    import paddle

    history = rng.integers(args.min_history, args.max_history + 1, args.batch)
    blocks_per = -(-(history + 1) // args.block_size)
    num_blocks = (int(blocks_per.max()) if shared else int(blocks_per.sum())) + 1
    free = rng.permutation(np.arange(1, num_blocks))
    tables = np.full((args.batch, blocks_per.max()), -1, np.int64)
    used = 0
    for b in range(args.batch):
        tables[b, : blocks_per[b]] = free[: blocks_per[b]] if shared else free[used : used + blocks_per[b]]
        used += 0 if shared else blocks_per[b]
    shape = (num_blocks, args.kv_heads, args.block_size, args.head_dim)

    def cache():
        if args.dtype == "float32":
            return paddle.to_tensor(rng.standard_normal(shape, dtype=np.float32))
        return paddle.to_tensor(rng.integers(0x3C00, 0x3F00, shape).astype(np.uint16))  # bf16 bits, |x| in [2^-7, 2)

    layers = 1 if shared else args.layers
    caches = [(cache(), cache()) for _ in range(layers)] * (args.layers if shared else 1)
    slots = np.array([tables[b, history[b] // args.block_size] * args.block_size + history[b] % args.block_size
                      for b in range(args.batch)], np.int64)
    index = [paddle.to_tensor(a) for a in (slots, np.arange(args.batch + 1, dtype=np.int64), history.astype(np.int64),
                                           tables)]
    width = (args.heads + 2 * args.kv_heads) * args.head_dim
    qkv = paddle.to_tensor(rng.standard_normal((args.batch, width), dtype=np.float32))
    return caches, index, qkv


def time_step(op, args, caches, index, qkv, kernel, flush):
    """Best and median ms of one step (every layer's call) over --rounds."""
    times = []
    for _ in range(args.rounds):
        if flush is not None:
            flush += 1.0  # 600 MB through the caches
        start = time.perf_counter()
        for key, value in caches:
            op(qkv, key, value, *index, args.heads, args.head_dim**-0.5, kernel)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[0] * 1e3, times[len(times) // 2] * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=18)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--min-history", type=int, default=42)
    ap.add_argument("--max-history", type=int, default=169)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--kernels", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    import fastdeploy  # noqa: F401  (first: it prepares the environment for paddle)
    from fastdeploy.model_executor.ops import compiled_op
    from fastdeploy.platforms.cpu import reuse_freed_memory, set_paddle_threads

    set_paddle_threads()
    reuse_freed_memory()
    op = compiled_op("append_attention")
    if op is None:
        sys.exit("the compiled custom ops are not built (python custom_ops/setup_ops.py)")
    rng = np.random.default_rng(0)
    flush = np.ones((600 << 20) // 8)
    print(f"batch {args.batch}, {args.heads}/{args.kv_heads} heads x {args.head_dim}, {args.layers} layers, "
          f"{args.dtype} cache, histories {args.min_history}-{args.max_history}: ms per step (best / median)")
    for where in ("cold", "warm", "l2"):
        caches, index, qkv = make_inputs(args, rng, shared=where == "l2")
        cells = []
        for kernel in args.kernels:
            best, median = time_step(op, args, caches, index, qkv, kernel, flush if where == "cold" else None)
            cells.append(f"kernel {kernel}: {best:6.2f} / {median:6.2f}")
        print(f"  {where:<5} " + "   ".join(cells))


if __name__ == "__main__":
    main()
