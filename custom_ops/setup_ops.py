"""Builds `fastdeploy_ops`, the engine's one custom-op extension module, with paddle.utils.cpp_extension.

Sources: every `cpu_ops/*.cc` (a CppExtension), plus every `gpu_ops/*.cu` when Paddle is built with
CUDA (then the build is a CUDAExtension; it needs CUDA_HOME pointing at a full toolkit). The module
is built into `build_directory()` (under `$XDG_CACHE_HOME/fastdeploy/ops`, default `~/.cache`),
keyed by the sources, the flags and the Paddle version, so an edit of any source rebuilds it and a
second process loads the existing build without compiling (`fastdeploy/model_executor/ops/loader.py`).

    python custom_ops/setup_ops.py        # build now (the README's commands run this); exit 0 either way

The engine also builds on first use when this was not run. When the build is impossible (no C++
compiler, no Paddle headers, ...) the engine runs its pure-Paddle fallbacks and logs why once.
`-march=native` is right here because the build runs on the machine that uses it.
"""
import hashlib
import os
import sys
from pathlib import Path

NAME = "fastdeploy_ops"
ROOT = Path(__file__).resolve().parent
CXX_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-std=c++17"]
NVCC_FLAGS = ["-O3", "--use_fast_math", "-std=c++17"]


def sources() -> list[Path]:
    """The C++ sources, and the CUDA sources too when Paddle has CUDA."""
    import paddle

    found = sorted((ROOT / "cpu_ops").glob("*.cc"))
    if paddle.is_compiled_with_cuda():
        found += sorted((ROOT / "gpu_ops").glob("*.cu"))
    return found


def build_directory() -> Path:
    import paddle

    digest = hashlib.sha256(paddle.__version__.encode() + " ".join(CXX_FLAGS + NVCC_FLAGS).encode())
    headers = sorted((ROOT / "cpu_ops").glob("*.h")) + sorted((ROOT / "gpu_ops").glob("*.cuh"))
    for source in sources() + headers:
        digest.update(source.name.encode() + source.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "fastdeploy" / "ops" / digest.hexdigest()[:16]


def build():
    """Compile (CppExtension, or CUDAExtension with .cu sources) and import the module; raises on failure."""
    from paddle.utils.cpp_extension import load

    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    return load(name=NAME, sources=[str(s) for s in sources()], extra_cxx_cflags=CXX_FLAGS,
                extra_cuda_cflags=NVCC_FLAGS, build_directory=str(directory), verbose=False)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT.parent))
    import fastdeploy  # noqa: F401  (prepares the environment before paddle is imported)
    from fastdeploy.model_executor.ops.loader import compiled_ops

    ops = compiled_ops()
    print(f"custom ops: built in {build_directory()}" if ops is not None
          else "custom ops: not built (see the warning above); the engine will use its pure-Paddle fallbacks")
