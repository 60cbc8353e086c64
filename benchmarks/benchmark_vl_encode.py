"""Image encode time of ERNIE-4.5-VL (vision tower + resampler), ours against transformers, in one run.

Real ERNIE-4.5-VL-28B-A3B vision shapes (hidden 1280, 16 heads, MLP 5120, `--depth` blocks (32 in the
model), resampler to text hidden 2560) with random weights: both sides fill every tensor from a numpy
generator seeded by the tensor's checkpoint name (normal, std 0.02; norm weights around 1), so they
compute on the same weights and their outputs are compared. Each side runs in its own child process
(transformers' torch and Paddle each bring an OpenMP runtime whose spinning threads would slow the
other), on the same thread count: ours (models/ernie4_5_vl/ VisionTransformer + Resampler, Paddle)
and transformers' Ernie4_5_VLMoeVisionTransformerPretrainedModel + VariableResolutionResamplerModel
(torch, sdpa attention). Images are sized by transformers' smart_resize (factor 28, its PIL
processor's default min/max pixels): 448x448 -> 32x32 patches, 1024x1024 -> 74x74. Each child warms
up on the first size, then encodes each size `--repeats` times; the best time is kept, wall-clock and
the child's CPU time (all its threads: less disturbed by other work on a shared machine than wall time).
`--rounds N` runs the two children alternately N times each (ours, transformers, ours, ...) and keeps
each side's best: on a shared machine the load changes between children.
`--dtype` (default bfloat16: real ERNIE-4.5-VL checkpoints are bf16, and `dtype="auto"` computes them in
bf16 on CPUs with AVX512-BF16/AMX) runs both sides in that dtype: transformers with its modules and
pixels in torch.bfloat16 (every op bf16); ours as the engine's bf16 weight format builds it (every linear
packed for `fd_packed_linear`, activations and attention float32). The weights are the same float32
values, rounded to bf16 by each side.

    python benchmarks/benchmark_vl_encode.py                      # 448 and 1024 at depth 32
    python benchmarks/benchmark_vl_encode.py --depth 4 --sizes 1024
    python benchmarks/benchmark_vl_encode.py --depth 8 --rounds 2   # alternating children
    python benchmarks/benchmark_vl_encode.py --dtype float32        # the exact mode
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TEXT_HIDDEN = 2560
RESAMPLER_NAMES = {".fc1.": ".0.", ".fc2.": ".2.", ".ln.": ".3."}  # transformers' names -> the checkpoint's


def weight(name: str, shape):
    """The benchmark's tensor `name` (checkpoint name, HF [out, in] orientation), the same in both children."""
    import zlib

    import numpy as np

    rng = np.random.default_rng(zlib.crc32(name.encode()))
    array = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    is_norm = name.endswith("weight") and len(shape) == 1
    return array + 1.0 if is_norm else array


def grid_of(size: int) -> tuple[int, int, int]:
    from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import smart_resize

    h, w = smart_resize(size, size, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 6177)
    return 1, h // 14, w // 14


def hf_config(depth: int) -> dict:
    return {"architectures": ["Ernie4_5_VLMoeForConditionalGeneration"],
            "text_config": {"hidden_size": TEXT_HIDDEN, "num_attention_heads": 20, "num_hidden_layers": 1,
                            "rms_norm_eps": 1e-5, "mlp_layer_types": ["dense"]},
            "vision_config": {"depth": depth}}


def ours_encoder(depth: int, dtype: str):
    from fastdeploy.model_executor.layers.linear import Linear
    from fastdeploy.model_executor.layers.quantization.weight_format import resolve_weight_format
    from fastdeploy.model_executor.models.ernie4_5_vl.config import VLConfig
    from fastdeploy.model_executor.models.ernie4_5_vl.resampler import Resampler
    from fastdeploy.model_executor.models.ernie4_5_vl.vision import VisionTransformer

    weight_format = resolve_weight_format(dtype, None, {}, None)  # the engine's choice for LLM(dtype=...)
    if weight_format.name != dtype:
        raise SystemExit(f"dtype={dtype!r} resolved to {weight_format.name!r} (no compiled ops?)")
    vl = VLConfig.from_hf(hf_config(depth))
    quant_config = weight_format.quant_config
    tower, resampler = VisionTransformer(vl.vision, quant_config), Resampler(vl, quant_config)
    for layer in (tower, resampler):
        linears = {f"{name}.weight": sub for name, sub in layer.named_sublayers() if isinstance(sub, Linear)}
        for name, param in layer.named_parameters():
            linear = linears.get(name)  # its weight is loaded as the checkpoint's [out, in]
            shape = (linear.out_features, linear.in_features) if linear is not None else param.shape
            param.weight_loader(param, weight(name, shape), None)

    def encode(pixels, grid):
        import paddle

        with paddle.no_grad():
            return resampler(tower(paddle.to_tensor(pixels), [grid]), [grid]).numpy()

    return encode


def hf_encoder(depth: int, dtype: str):
    import torch
    from transformers import Ernie4_5_VLMoeConfig
    from transformers.models.ernie4_5_vl_moe import modeling_ernie4_5_vl_moe as m

    config = Ernie4_5_VLMoeConfig(text_config={"hidden_size": TEXT_HIDDEN}, vision_config={"depth": depth})
    config.vision_config._attn_implementation = "sdpa"
    tower = m.Ernie4_5_VLMoeVisionTransformerPretrainedModel._from_config(config.vision_config).eval()
    resampler = m.Ernie4_5_VLMoeVariableResolutionResamplerModel(config).eval()
    with torch.no_grad():
        for module in (tower, resampler):
            for name, param in module.named_parameters():
                for a, b in RESAMPLER_NAMES.items():
                    name = name.replace(a, b) if name.startswith(("spatial_linear", "temporal_linear")) else name
                param.copy_(torch.from_numpy(weight(name, tuple(param.shape))))
    torch_dtype = getattr(torch, dtype)
    tower, resampler = tower.to(torch_dtype), resampler.to(torch_dtype)

    def encode(pixels, grid):
        with torch.no_grad():
            grid_t = torch.tensor([grid])
            x = torch.from_numpy(pixels).to(torch_dtype)
            return resampler(tower(x, grid_t).last_hidden_state, grid_t).float().numpy()

    return encode


def child(engine: str, depth: int, dtype: str, grids: dict, repeats: int, out_dir: str) -> None:
    if engine == "ours":
        sys.path.insert(0, ROOT)
        import fastdeploy  # noqa: F401  (first: thread count and MKL's CPU type before paddle loads)
        from fastdeploy.platforms.cpu import reuse_freed_memory, set_paddle_threads

        threads = set_paddle_threads()
        reuse_freed_memory()  # as LLMEngine.from_engine_args does for the engine's process
        encode = ours_encoder(depth, dtype)
    else:
        import torch

        threads = int(os.environ["BENCH_THREADS"])
        torch.set_num_threads(threads)
        encode = hf_encoder(depth, dtype)
    import numpy as np

    results = {"threads": threads}
    for i, (size, grid) in enumerate(grids.items()):
        size, grid = int(size), tuple(grid)  # JSON keys are strings
        pixels = np.random.default_rng(size).standard_normal((grid[1] * grid[2], 588)).astype(np.float32)
        if i == 0:
            encode(pixels, grid)  # warm-up
        times, cpu_times = [], []
        for _ in range(repeats):
            start, cpu_start = time.perf_counter(), time.process_time()
            out = encode(pixels, grid)
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        np.save(os.path.join(out_dir, f"{engine}_{size}.npy"), out)
        results[size] = {"seconds": min(times), "cpu_seconds": min(cpu_times), "grid": grid, "tokens": out.shape[0],
                         "load": os.getloadavg()[0]}
    with open(os.path.join(out_dir, f"{engine}.json"), "w") as f:
        json.dump(results, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="448,1024")
    parser.add_argument("--depth", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="children run alternately this many times each")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16",
                        help="both engines compute in this dtype (default: the checkpoints' bf16)")
    parser.add_argument("--child", choices=["ours", "hf"], help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    parser.add_argument("--grids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # the grids come from the parent: transformers (and torch's OpenMP) stay out of ours
        child(args.child, args.depth, args.dtype, json.loads(args.grids), args.repeats, args.out_dir)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    grids = json.dumps({size: grid_of(size) for size in sizes})
    import numpy as np

    with tempfile.TemporaryDirectory() as out_dir:
        results, threads = {"ours": {}, "hf": {}}, None
        for _ in range(args.rounds):  # ours, transformers, ours, ...: each side's best over the rounds
            for engine in ("ours", "hf"):
                env = dict(os.environ)
                if threads is not None:
                    env["BENCH_THREADS"] = str(threads)
                print(f"running {engine} (load average {os.getloadavg()[0]:.2f}) ...", flush=True)
                subprocess.run([sys.executable, __file__, "--child", engine, "--depth", str(args.depth), "--dtype",
                                args.dtype, "--grids", grids, "--repeats", str(args.repeats), "--out-dir", out_dir],
                               check=True, env=env)
                with open(os.path.join(out_dir, f"{engine}.json")) as f:
                    found = json.load(f)
                threads = found.pop("threads")
                for size, result in found.items():
                    best = results[engine].get(size)
                    results[engine][size] = result if best is None else {
                        **min(best, result, key=lambda r: r["seconds"]),
                        "cpu_seconds": min(best["cpu_seconds"], result["cpu_seconds"])}
        print(f"{args.dtype}, depth {args.depth}, {threads} threads, CPU {os.cpu_count()} cores")
        for size in sizes:
            ours, hf = results["ours"][str(size)], results["hf"][str(size)]
            reference = np.load(os.path.join(out_dir, f"hf_{size}.npy"))
            diff = np.abs(np.load(os.path.join(out_dir, f"ours_{size}.npy")) - reference).max()
            print(f"{size}x{size}: grid {tuple(ours['grid'])} -> {ours['tokens']} tokens | ours {ours['seconds']:.2f} s "
                  f"(cpu {ours['cpu_seconds']:.2f} s, load {ours['load']:.1f}) | transformers {hf['seconds']:.2f} s "
                  f"(cpu {hf['cpu_seconds']:.2f} s, load {hf['load']:.1f}) | transformers / ours: wall "
                  f"{hf['seconds'] / ours['seconds']:.2f}, cpu {hf['cpu_seconds'] / ours['cpu_seconds']:.2f} | "
                  f"max |diff| {diff:.1e} ({diff / np.abs(reference).max():.1e} of max |transformers|)")


if __name__ == "__main__":
    main()
