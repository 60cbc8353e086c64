"""Builds `fastdeploy_ops`, the engine's one custom-op extension module, with paddle.utils.cpp_extension.

Sources: every `cpu_ops/*.cc` (a CppExtension), plus every `gpu_ops/*.cu` when Paddle is built with
CUDA (then the build is a CUDAExtension; it needs CUDA_HOME pointing at a full toolkit). The module
is built into `build_directory()` (under `$XDG_CACHE_HOME/fastdeploy/ops`, default `~/.cache`),
keyed by the sources, the flags, the Paddle version and the CPU (`cpu_description()`), so an edit of
any source rebuilds it, a second process loads the existing build without compiling
(`fastdeploy/model_executor/ops/loader.py`), and a cache shared between machines (a home directory on
NFS, a container image moved to another host) never hands one CPU a build made for another.

    python custom_ops/setup_ops.py        # build now (the README's commands run this); exit 0 either way

The engine also builds on first use when this was not run. When the build is impossible (no C++
compiler, no Paddle headers, ...) the engine runs its pure-Paddle fallbacks and logs why once.
`-march=native` is right here because the build runs on the machine that uses it (and the cache key
holds that machine's CPU). No `-ffast-math`: the ops are fed -inf (banned tokens, masks), which its
`-ffinite-math-only` lets the compiler assume away; the flags keep its harmless part (math functions
need not set errno; floating-point operations are taken not to trap, as they do not by default) and
state the FMA contraction g++ does anyway in C++.
"""
import hashlib
import os
import platform
import sys
from pathlib import Path
from typing import Callable

NAME = "fastdeploy_ops"
ROOT = Path(__file__).resolve().parent
CXX_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=fast",
             "-std=c++17"]
# /proc/cpuinfo lines that name what -march=native targets: x86 (model name, ISA flags), Arm (Features,
# implementer and part)
CPU_KEYS = ("model name", "flags", "Features", "CPU implementer", "CPU part")
NVCC_FLAGS = ["-O3", "--use_fast_math", "-std=c++17"]


def sources() -> list[Path]:
    """The C++ sources, and the CUDA sources too when Paddle has CUDA."""
    import paddle

    found = sorted((ROOT / "cpu_ops").glob("*.cc"))
    if paddle.is_compiled_with_cuda():
        found += sorted((ROOT / "gpu_ops").glob("*.cu"))
    return found


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU the build targets: the CPU_KEYS lines of the first processor in `cpuinfo`, or, where that
    file is absent or holds none of them, platform.processor() and platform.machine()."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    found = {}
    for line in text.split("\n\n", 1)[0].splitlines():  # the first processor's block
        key, _, value = line.partition(":")
        if key.strip() in CPU_KEYS:
            found[key.strip()] = " ".join(value.split())
    if found:
        return "\n".join(f"{key}: {found[key]}" for key in sorted(found))
    return f"processor: {platform.processor()}\nmachine: {platform.machine()}"


def build_directory(cpu: Callable[[], str] = cpu_description) -> Path:
    """`$XDG_CACHE_HOME/fastdeploy/ops/<16 hex digits>` (default ~/.cache): a hash of the Paddle version,
    the flags, cpu() (a CPU description; injectable for tests), and every source and header."""
    import paddle

    digest = hashlib.sha256(paddle.__version__.encode() + " ".join(CXX_FLAGS + NVCC_FLAGS).encode())
    digest.update(cpu().encode())
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
    if sys.argv[1:] == ["--compile-only"]:  # the engine's loader, which holds the build lock, asks this
        build()
        sys.exit(0)
    if ROOT.parent.name != "fastdeploy":  # a source checkout's custom_ops/ (installed: fastdeploy/_custom_ops/)
        sys.path.insert(0, str(ROOT.parent))
    import fastdeploy  # noqa: F401  (prepares the environment before paddle is imported)
    from fastdeploy.model_executor.ops.loader import compiled_ops

    ops = compiled_ops()
    print(f"custom ops: built in {build_directory()}" if ops is not None
          else "custom ops: not built (see the warning above); the engine will use its pure-Paddle fallbacks")
