"""Linear-layer kernels at ERNIE-4.5-0.3B's shapes: ours (bf16 / wint8 / wint4) vs Paddle fp32 vs MKL.

For each weight of the model (qkv, o, gate_up, down, lm_head; K and N below) and M = 1, 8, 32, 64, 256 rows
of x, the best of --repeats timings of y = x @ W^T, two threads, printed as GFLOP/s (2 M N K / t) with
the weight's GB/s (bytes of W as the kernel reads it / t; what bounds decode), and, in a second table,
GFLOP per CPU-second (t the process's CPU time over both threads): the kernel's efficiency per core,
which other jobs on the machine disturb far less than wall time:

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
        [--rows 1,8,32,64,256]
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

REPO = Path(__file__).resolve().parents[1]
# ERNIE-4.5-0.3B: hidden 1024, 16 heads and 2 KV heads of 128, intermediate 3072, vocab 103424
SHAPES = {"qkv": (1024, 2560), "o": (2048, 1024), "gate_up": (1024, 6144), "down": (3072, 1024),
          "lm_head": (1024, 103424)}  # name: (K, N)
ERNIE_SHAPES = ",".join(SHAPES)
# ERNIE-4.5-VL's vision encoder (hidden 1280, MLP 5120; 5476 patches for a 1024x1024 image): --shapes
# vl_qkv,vl_proj,vl_fc1,vl_fc2 --rows 5476
SHAPES.update({"vl_qkv": (1280, 3840), "vl_proj": (1280, 1280), "vl_fc1": (1280, 5120), "vl_fc2": (5120, 1280)})
ROWS = (1, 8, 32, 64, 256)
THREADS = 2


def best_time(fn, repeats: int) -> tuple[float, float]:
    """(best wall seconds, best CPU seconds of this process: all its threads) of one call."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return min(wall), min(cpu)


def ours(shapes, repeats) -> list[dict]:
    sys.path.insert(0, str(REPO))
    import fastdeploy  # noqa: F401  (CPU environment before paddle)
    import paddle

    from fastdeploy.model_executor.layers.quantization.packed import BF16, NO_BIAS, WINT4, WINT8, pack, packed_bytes
    from fastdeploy.model_executor.ops import compiled_op

    paddle.base.core.set_num_threads(THREADS)
    op = compiled_op("fd_packed_linear")
    rng = np.random.default_rng(0)
    rows = []
    for name in shapes:
        K, N = SHAPES[name]
        w = rng.standard_normal((N, K)).astype(np.float32) * 0.02
        dense = paddle.to_tensor(np.ascontiguousarray(w.T))
        packed = {kind: paddle.to_tensor(pack(w, kind)) for kind in (BF16, WINT8, WINT4)}
        for m in ROWS:
            x = paddle.to_tensor(rng.standard_normal((m, K)).astype(np.float32))
            t = best_time(lambda: paddle.matmul(x, dense), repeats)
            rows.append(dict(shape=name, m=m, kernel="paddle-fp32", seconds=t[0], cpu=t[1], weight_bytes=4 * N * K))
            for label, kind in (("ours-bf16", BF16), ("ours-wint8", WINT8), ("ours-wint4", WINT4)):
                t = best_time(lambda: op(x, packed[kind], NO_BIAS, kind, N, False, 0), repeats)
                rows.append(dict(shape=name, m=m, kernel=label, seconds=t[0], cpu=t[1],
                                 weight_bytes=packed_bytes(kind, N, K)))
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
    global ROWS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--shapes", default=ERNIE_SHAPES, help=f"names from {','.join(SHAPES)}")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="values of M")
    parser.add_argument("--mkl-lib", default="", help="folder with libmkl_rt.so.3 (default: the mkl wheel's)")
    parser.add_argument("--mkl-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    ROWS = tuple(int(m) for m in args.rows.split(","))
    if args.mkl_child:
        print(json.dumps(mkl_child(shapes, args.repeats, args.mkl_lib)))
        return
    rows = ours(shapes, args.repeats)
    lib = mkl_lib_dir(args.mkl_lib)
    if lib:
        env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), GOMP_SPINCOUNT="0")
        out = subprocess.run([sys.executable, __file__, "--mkl-child", "--mkl-lib", lib, "--repeats",
                              str(args.repeats), "--shapes", args.shapes, "--rows", args.rows],
                             env=env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"the MKL child failed:\n{out.stderr}")
        rows += json.loads(out.stdout.strip().splitlines()[-1])
    else:
        print("MKL not found (pip install mkl, or --mkl-lib DIR): its kernels are left out")
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    table = {(r["shape"], r["m"], r["kernel"]): r for r in rows}

    def print_table(title, cell):
        print(title)
        print(f"{'shape':>8} {'M':>4} " + " ".join(f"{k:>16}" for k in kernels))
        for name in shapes:
            K, N = SHAPES[name]
            for m in ROWS:
                cells = [cell(table[(name, m, k)], 2 * m * N * K) if (name, m, k) in table else "-" for k in kernels]
                print(f"{name:>8} {m:>4} " + " ".join(f"{c:>16}" for c in cells))

    print(f"best of {args.repeats}, {THREADS} threads; load average at the end: {os.getloadavg()[0]:.2f}")
    print_table("wall clock: GFLOP/s (weight GB/s)",
                lambda r, flop: f"{flop / r['seconds'] / 1e9:.1f} ({r['weight_bytes'] / r['seconds'] / 1e9:.1f})")
    print_table("GFLOP per CPU-second", lambda r, flop: f"{flop / r['cpu'] / 1e9:.1f}")


if __name__ == "__main__":
    main()
