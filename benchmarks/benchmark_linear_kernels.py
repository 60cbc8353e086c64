"""Linear-layer kernels at a model's shapes: ours (bf16 / wint8 / wint4, GGUF blocks) vs Paddle fp32 vs MKL.

For each weight of the model (qkv, o, gate_up, down, lm_head; K and N below; --shapes ernie, the default, is
ERNIE-4.5-0.3B's, --shapes smollm2 the default model's) and M = 1, 8, 32, 64, 256 rows of x (--rows), the
best of --repeats timings of y = x @ W^T, two threads, printed as GFLOP/s (2 M N K / t) with the weight's
GB/s (bytes of W as the kernel reads it / t; what bounds decode), and, in a second table, GFLOP per
CPU-second (t the process's CPU time over both threads): the kernel's efficiency per core, which other jobs
on the machine disturb far less than wall time (exact with --threads 1: with two, a call shorter than the
scheduler's tick can miss the other thread's share). A third table gives each kernel's time at M rows over its
time at M = 1 (wall and CPU), per shape and for the sum of the shapes: what verifying M - 1 draft tokens in
one forward costs over a decode step. Each call reads the next of as many copies of the weight as make at
least --stream-mb, so the weights come from memory, as in a model's step, not from the L3 cache:

  * paddle-fp32: `paddle.matmul(x, W[K, N])` (Paddle's bundled MKL 2019; MKL_DEBUG_CPU_TYPE=5 set by
    `import fastdeploy`), the engine's dense path today;
  * ours-bf16 / ours-wint8 / ours-wint4: the compiled `fd_packed_linear` (AVX512-BF16 register tiles; from
    7 rows AMX tiles where the CPU has AMX);
  * mkl-bf16: MKL's `cblas_gemm_bf16bf16f32` (x and W in bf16, float32 out), and mkl-bf16-packed on a
    weight packed once by `cblas_gemm_bf16bf16f32_pack`;
  * mkl-s8u8: MKL's `cblas_gemm_s8u8s32` (W int8, x as uint8: integer-only, a W8A8 kernel, so only a
    bound on what int8 arithmetic reaches here; weight-only int8 needs float activations).

MKL comes from the `mkl` wheel on PyPI (`pip install mkl`; or unpack it and pass --mkl-lib DIR) and is
timed in a child process without Paddle (its libiomp5 is another OpenMP runtime), threaded by GNU
OpenMP (MKL_THREADING_LAYER=GNU) on the same two threads.

    python benchmarks/benchmark_linear_kernels.py [--repeats 20] [--mkl-lib DIR] [--shapes qkv,lm_head]
        [--rows 1,8,32,64,256] [--kernels ours-bf16,gguf-q4_1] [--stream-mb 64]
    python benchmarks/benchmark_linear_kernels.py --shapes smollm2 --rows 1,2,3,4,5,6,7,8 --no-mkl
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
# ERNIE-4.5-0.3B: hidden 1024, 16 heads and 2 KV heads of 128, intermediate 3072, vocab 103424
SHAPES = {"qkv": (1024, 2560), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024),
          "lm_head": (1024, 103424)}  # name: (K, N)
# SmolLM2-135M-Instruct (the default model): hidden 576, 9 heads and 3 KV heads of 64, intermediate 1536,
# vocab 49152
SHAPES.update({"smol_qkv": (576, 960), "smol_o": (576, 576), "smol_gate_up": (576, 3072), "smol_down": (1536, 576),
               "smol_lm_head": (576, 49152)})
SHAPE_SETS = {"ernie": "qkv,o,gate_up,down,lm_head",
              "smollm2": "smol_qkv,smol_o,smol_gate_up,smol_down,smol_lm_head"}
# ERNIE-4.5-VL's vision encoder (hidden 1280, MLP 5120; 5476 patches for a 1024x1024 image): --shapes
# vl_qkv,vl_proj,vl_fc1,vl_fc2 --rows 5476
SHAPE_SETS["vl"] = "vl_qkv,vl_proj,vl_fc1,vl_fc2"
SHAPES.update({"vl_qkv": (1280, 3840), "vl_proj": (1280, 1280), "vl_fc1": (1280, 5120), "vl_fc2": (5120, 1280)})
ROWS = (1, 8, 32, 64, 256)
THREADS = 2
GGUF_KERNELS = {"gguf-q4_0": 2, "gguf-q4_1": 3, "gguf-q8_0": 8, "gguf-q4_k": 12, "gguf-q6_k": 14}  # ggml type ids
OURS = ("paddle-fp32", "ours-bf16", "ours-wint8", "ours-wint4", *GGUF_KERNELS)


def best_time(fn, repeats: int, copies: int = 1) -> tuple[float, float]:
    """(best wall seconds, best CPU seconds of this process: all its threads) of one call; fn(i) runs on
    copy i % copies of the weight."""
    for i in range(copies):
        fn(i)
    wall, cpu = [], []
    for i in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn(i % copies)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return min(wall), min(cpu)


def gguf_weight(rng, qtype: int, N: int, K: int):
    """Random GGUF blocks of type qtype for W [N, K] as gguf_linear takes them, or None where K does not fit."""
    import gguf
    import paddle

    from fastdeploy.model_executor.model_loader.quantized import ROW_MAJOR_BLOCKS
    from fastdeploy.model_executor.ops import compiled_op

    if qtype in ROW_MAJOR_BLOCKS:  # random valid blocks (gguf-py has no K-quant quantizer): small float16 scales
        values, nbytes = ROW_MAJOR_BLOCKS[qtype]
        if K % values:
            return None
        blocks = rng.integers(0, 256, (N, K // values, nbytes), dtype=np.uint8)
        for at in {12: (0, 2), 14: (208,)}[qtype]:  # Q4_K: d, dmin; Q6_K: d
            blocks[..., at:at + 2] = rng.uniform(0.001, 0.05, blocks.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
        return paddle.to_tensor(blocks.reshape(N, -1))
    w = rng.standard_normal((N, K)).astype(np.float32) * 0.02
    blocks = gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype))
    return compiled_op("gguf_interleave_rows")(paddle.to_tensor(blocks), qtype)


def ours(shapes, kernels, repeats, stream_bytes) -> list[dict]:
    sys.path.insert(0, str(REPO))
    import fastdeploy  # noqa: F401  (CPU environment before paddle)
    import paddle

    from fastdeploy.model_executor.layers.quantization.packed import BF16, NO_BIAS, WINT4, WINT8, pack
    from fastdeploy.model_executor.ops import compiled_op

    paddle.base.core.set_num_threads(THREADS)
    packed_op, gguf_op = compiled_op("fd_packed_linear"), compiled_op("gguf_linear")
    packed_kinds = {"ours-bf16": BF16, "ours-wint8": WINT8, "ours-wint4": WINT4}
    rng = np.random.default_rng(0)
    rows = []
    for name in shapes:
        K, N = SHAPES[name]
        w = rng.standard_normal((N, K)).astype(np.float32) * 0.02
        for label in kernels:
            if label == "paddle-fp32":
                weight = paddle.to_tensor(np.ascontiguousarray(w.T))
                call = lambda x, W: paddle.matmul(x, W)  # noqa: E731
            elif label in packed_kinds:
                kind = packed_kinds[label]
                weight = paddle.to_tensor(pack(w, kind))
                call = lambda x, W, kind=kind: packed_op(x, W, NO_BIAS, kind, N, False, 0)  # noqa: E731
            else:
                qtype = GGUF_KERNELS[label]
                weight = gguf_weight(rng, qtype, N, K)
                if weight is None:
                    continue
                call = lambda x, W, qtype=qtype: gguf_op(x, W, qtype, N)  # noqa: E731
            nbytes = int(np.prod(weight.shape)) * weight.element_size()
            weights = [weight] + [weight.clone() for _ in range(-(-stream_bytes // nbytes) - 1)]
            for m in ROWS:
                x = paddle.to_tensor(rng.standard_normal((m, K)).astype(np.float32))
                t = best_time(lambda i: call(x, weights[i]), repeats, len(weights))
                rows.append(dict(shape=name, m=m, kernel=label, seconds=t[0], cpu=t[1], weight_bytes=nbytes))
            del weights, weight
    return rows


def mkl_child(shapes, repeats, lib_dir: str) -> list[dict]:
    """Runs in a child process: MKL through ctypes."""
    ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
    mkl = ctypes.CDLL(str(Path(lib_dir) / "libmkl_rt.so.3"))
    mkl.MKL_Set_Threading_Layer(ctypes.c_int(1))  # MKL_THREADING_GNU
    mkl.MKL_Set_Num_Threads(ctypes.c_int(THREADS))
    row_major, no_trans, trans, fix_offset, packed, b_matrix = 101, 111, 112, 173, 151, 162  # mkl_cblas.h enums
    i, f, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p  # MKL_INT is 32-bit (mkl_rt's LP64 default)
    mkl.cblas_gemm_bf16bf16f32_pack_get_size.restype = ctypes.c_size_t
    rng = np.random.default_rng(0)
    rows = []
    for name in shapes:
        K, N = SHAPES[name]
        w16 = (rng.standard_normal((N, K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        w8 = rng.integers(-127, 128, (N, K), dtype=np.int8)
        # B = W^T [K, N]: W [N, K] row-major read transposed
        size = mkl.cblas_gemm_bf16bf16f32_pack_get_size(i(b_matrix), i(max(ROWS)), i(N), i(K))
        w16_packed = np.empty(size, np.uint8)
        mkl.cblas_gemm_bf16bf16f32_pack(i(row_major), i(b_matrix), i(trans), i(max(ROWS)), i(N), i(K),
                                        w16.ctypes.data_as(p), i(K), w16_packed.ctypes.data_as(p))
        for m in ROWS:
            x16 = (rng.standard_normal((m, K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            xu8 = rng.integers(0, 256, (m, K), dtype=np.uint8)
            y = np.empty((m, N), np.float32)
            yt = np.empty((N, m), np.int32)
            co = np.zeros(1, np.int32)

            def bf16():
                mkl.cblas_gemm_bf16bf16f32(i(row_major), i(no_trans), i(trans), i(m), i(N), i(K), f(1.0),
                                           x16.ctypes.data_as(p), i(K), w16.ctypes.data_as(p), i(K), f(0.0),
                                           y.ctypes.data_as(p), i(N))

            def bf16_packed():
                mkl.cblas_gemm_bf16bf16f32_compute(i(row_major), i(no_trans), i(packed), i(m), i(N), i(K),
                                                   f(1.0), x16.ctypes.data_as(p), i(K), w16_packed.ctypes.data_as(p),
                                                   i(K), f(0.0), y.ctypes.data_as(p), i(N))

            def s8u8():  # y^T [N, m] = W [N, K] (s8) @ x^T (u8)
                mkl.cblas_gemm_s8u8s32(i(row_major), i(no_trans), i(trans), i(fix_offset), i(N), i(m), i(K), f(1.0),
                                       w8.ctypes.data_as(p), i(K), ctypes.c_int8(0), xu8.ctypes.data_as(p), i(K),
                                       ctypes.c_uint8(0), f(0.0), yt.ctypes.data_as(p), i(m), co.ctypes.data_as(p))

            for label, fn, nbytes in (("mkl-bf16", bf16, 2 * N * K), ("mkl-bf16-packed", bf16_packed, 2 * N * K),
                                      ("mkl-s8u8", s8u8, N * K)):
                t = best_time(fn, repeats)
                rows.append(dict(shape=name, m=m, kernel=label, seconds=t[0], cpu=t[1], weight_bytes=nbytes))
    return rows


def mkl_lib_dir(given: str) -> str:
    if given:
        return given
    for directory in (Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib"):
        if (directory / "libmkl_rt.so.3").is_file():
            return str(directory)
    return ""


def main():
    global ROWS, THREADS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--shapes", default="ernie",
                        help=f"names from {','.join(SHAPES)}, or a set: {', '.join(SHAPE_SETS)}")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="values of M")
    parser.add_argument("--kernels", default=",".join(OURS), help=f"ours to time, from {','.join(OURS)}")
    parser.add_argument("--threads", type=int, default=THREADS,
                        help="threads per call (1: the CPU-time columns are exact, whatever else the machine runs)")
    parser.add_argument("--stream-mb", type=int, default=64,
                        help="each call reads the next of as many weight copies as make this many MiB (0: one copy)")
    parser.add_argument("--mkl-lib", default="", help="folder with libmkl_rt.so.3 (default: the mkl wheel's)")
    parser.add_argument("--no-mkl", action="store_true", help="leave MKL's kernels out")
    parser.add_argument("--mkl-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    THREADS = args.threads
    args.shapes = SHAPE_SETS.get(args.shapes, args.shapes)
    shapes = args.shapes.split(",")
    kernels = args.kernels.split(",") if args.kernels else []
    for name in (n for n in shapes if n not in SHAPES):
        sys.exit(f"--shapes: unknown shape {name!r}; allowed: {', '.join(SHAPES)} or {', '.join(SHAPE_SETS)}")
    for label in (k for k in kernels if k not in OURS):
        sys.exit(f"--kernels: unknown kernel {label!r}; allowed: {', '.join(OURS)}")
    ROWS = tuple(int(m) for m in args.rows.split(","))
    if args.mkl_child:
        print(json.dumps(mkl_child(shapes, args.repeats, args.mkl_lib)))
        return
    rows = ours(shapes, kernels, args.repeats, args.stream_mb * MB)
    lib = "" if args.no_mkl else mkl_lib_dir(args.mkl_lib)
    if lib:
        env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), GOMP_SPINCOUNT="0")
        out = subprocess.run([sys.executable, __file__, "--mkl-child", "--mkl-lib", lib, "--threads", str(THREADS), "--repeats",
                              str(args.repeats), "--shapes", args.shapes, "--rows", args.rows],
                             env=env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"the MKL child failed:\n{out.stderr}")
        rows += json.loads(out.stdout.strip().splitlines()[-1])
    elif not args.no_mkl:
        print("MKL not found (pip install mkl, or --mkl-lib DIR): its kernels are left out")
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    table = {(r["shape"], r["m"], r["kernel"]): r for r in rows}

    def print_table(title, cell):
        print(title)
        print(f"{'shape':>12} {'M':>4} " + " ".join(f"{k:>16}" for k in kernels))
        for name in shapes:
            K, N = SHAPES[name]
            for m in ROWS:
                cells = [cell(table[(name, m, k)], 2 * m * N * K) if (name, m, k) in table else "-" for k in kernels]
                print(f"{name:>12} {m:>4} " + " ".join(f"{c:>16}" for c in cells))

    print(f"best of {args.repeats}, {THREADS} threads, weights streamed over {args.stream_mb} MiB; "
          f"load average at the end: {os.getloadavg()[0]:.2f}")
    print_table("wall clock: GFLOP/s (weight GB/s)",
                lambda r, flop: f"{flop / r['seconds'] / 1e9:.1f} ({r['weight_bytes'] / r['seconds'] / 1e9:.1f})")
    print_table("GFLOP per CPU-second", lambda r, flop: f"{flop / r['cpu'] / 1e9:.1f}")
    if 1 in ROWS:
        print_ratios(table, shapes, kernels)


def print_ratios(table, shapes, kernels):
    """Time at M rows over time at M = 1, wall (CPU) per kernel, per shape and for the shapes' sum ("sum":
    shapes a kernel has at every M)."""
    print("ratio to M=1: wall (CPU time)")
    print(f"{'shape':>12} {'M':>4} " + " ".join(f"{k:>16}" for k in kernels))

    def cell(names, m, k, key):
        if not all((n, mm, k) in table for n in names for mm in (1, m)):
            return None
        return sum(table[(n, m, k)][key] for n in names) / sum(table[(n, 1, k)][key] for n in names)

    for label, names in [*((n, [n]) for n in shapes), ("sum", None)]:
        for m in ROWS[1:] if ROWS[0] == 1 else ROWS:
            cells = []
            for k in kernels:
                present = names or [n for n in shapes if all((n, mm, k) in table for mm in ROWS)]
                wall, cpu = cell(present, m, k, "seconds"), cell(present, m, k, "cpu")
                cells.append("-" if wall is None or not present else f"{wall:.2f} ({cpu:.2f})")
            print(f"{label:>12} {m:>4} " + " ".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    main()
