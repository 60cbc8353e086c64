"""Builds the engine's custom-op extension modules with paddle.utils.cpp_extension.

- `fastdeploy_ops` (`CPU_OPS`): every `cpu_ops/*.cc`, a CppExtension. The engine calls these ops
  (`fastdeploy/model_executor/ops/loader.py`), or their pure-Paddle fallbacks when the module cannot
  be built. It never holds a CUDA source.
- `fastdeploy_gpu_ops` (`GPU_OPS`): every `gpu_ops/*.cu`, a CUDAExtension, built only when Paddle is
  built with CUDA (it needs CUDA_HOME pointing at a full toolkit). The engine computes on the CPU and
  does not call these kernels yet; their harness checks them (custom_ops/README.md). A separate
  module, so a failing CUDA build never takes the CPU ops with it.

Each module is built into its `build_directory()` (under `$XDG_CACHE_HOME/fastdeploy/ops`, default
`~/.cache`), keyed by its own sources and headers, the flags, the Paddle version and the CPU
(`cpu_description()`): an edit of one of its sources rebuilds it (the CPU module's key does not
depend on gpu_ops/, nor the GPU module's on cpu_ops/), a second process loads the existing build
without compiling, and a cache shared between machines (a home directory on NFS, a container image
moved to another host) never hands one CPU a build made for another.

    python custom_ops/setup_ops.py        # build now (the README's commands run this); exit 0 either way

The engine also builds `fastdeploy_ops` on first use when this was not run. When the build is
impossible (no C++ compiler, no Paddle headers, ...) the engine runs its pure-Paddle fallbacks and
logs why once. `-march=native` is right here because the build runs on the machine that uses it (and
the cache key holds that machine's CPU). No `-ffast-math`: the ops are fed -inf (banned tokens,
masks), which its `-ffinite-math-only` lets the compiler assume away; the flags keep its harmless part
(math functions need not set errno; floating-point operations are taken not to trap, as they do not
by default) and state the FMA contraction g++ does anyway in C++.
"""
import hashlib
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent
CXX_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=fast",
             "-std=c++17"]
# /proc/cpuinfo lines that name what -march=native targets: x86 (model name, ISA flags), Arm (Features,
# implementer and part)
CPU_KEYS = ("model name", "flags", "Features", "CPU implementer", "CPU part")
NVCC_FLAGS = ["-O3", "--use_fast_math", "-std=c++17"]


@dataclass(frozen=True)
class Extension:
    """One extension module: its name, the folder of its sources, and the suffixes of its compiled
    sources and of the headers they include."""

    name: str
    folder: str
    source_suffix: str
    header_suffix: str

    def sources(self) -> list[Path]:
        return sorted((ROOT / self.folder).glob(f"*{self.source_suffix}"))

    def headers(self) -> list[Path]:
        return sorted((ROOT / self.folder).glob(f"*{self.header_suffix}"))


CPU_OPS = Extension("fastdeploy_ops", "cpu_ops", ".cc", ".h")
GPU_OPS = Extension("fastdeploy_gpu_ops", "gpu_ops", ".cu", ".cuh")
NAME = CPU_OPS.name  # the module the engine loads


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


def build_directory(cpu: Callable[[], str] = cpu_description, extension: Extension = CPU_OPS) -> Path:
    """`$XDG_CACHE_HOME/fastdeploy/ops/<16 hex digits>` (default ~/.cache): a hash of the module's name,
    the Paddle version, the flags, cpu() (a CPU description; injectable for tests), and the module's
    own sources and headers."""
    import paddle

    digest = hashlib.sha256(f"{extension.name} {paddle.__version__} {' '.join(CXX_FLAGS + NVCC_FLAGS)}".encode())
    digest.update(cpu().encode())
    for source in extension.sources() + extension.headers():
        digest.update(source.name.encode() + source.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "fastdeploy" / "ops" / digest.hexdigest()[:16]


def build(extension: Extension = CPU_OPS):
    """Compile (CppExtension; CUDAExtension for .cu sources) and import the module; raises on failure."""
    from paddle.utils.cpp_extension import load

    directory = build_directory(extension=extension)
    directory.mkdir(parents=True, exist_ok=True)
    return load(name=extension.name, sources=[str(s) for s in extension.sources()], extra_cxx_cflags=CXX_FLAGS,
                extra_cuda_cflags=NVCC_FLAGS, build_directory=str(directory), verbose=False)


def build_gpu_ops() -> str:
    """Build `fastdeploy_gpu_ops` where Paddle has CUDA; a line saying what happened. A failure is
    reported, not raised: the CPU module is another build."""
    import paddle

    if not paddle.is_compiled_with_cuda():
        return "gpu ops: not built (this Paddle has no CUDA)"
    try:
        build(GPU_OPS)
    except Exception as e:  # nvcc missing or failing: the CPU ops are unaffected
        return f"gpu ops: not built ({type(e).__name__}: {str(e)[-2000:]}); the CPU ops are unaffected"
    return f"gpu ops: built in {build_directory(extension=GPU_OPS)}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--compile-only"]:  # the engine's loader, which holds the build lock, asks this (CPU)
        build()
        sys.exit(0)
    if ROOT.parent.name != "fastdeploy":  # a source checkout's custom_ops/ (installed: fastdeploy/_custom_ops/)
        sys.path.insert(0, str(ROOT.parent))
    import fastdeploy  # noqa: F401  (prepares the environment before paddle is imported)
    from fastdeploy.model_executor.ops.loader import compiled_ops

    ops = compiled_ops()
    print(f"custom ops: built in {build_directory()}" if ops is not None
          else "custom ops: not built (see the warning above); the engine will use its pure-Paddle fallbacks")
    print(build_gpu_ops())
