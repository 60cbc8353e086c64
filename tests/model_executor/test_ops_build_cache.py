"""The op build cache (custom_ops/setup_ops.py, build_directory) is keyed by the CPU: the build uses
-march=native, so a cache shared between machines (NFS home, a moved container image) must not hand a
build for one CPU to another (SIGILL on an instruction the other lacks). The CPU module `fastdeploy_ops`
and the CUDA module `fastdeploy_gpu_ops` are separate builds: the CPU one never compiles a .cu source
(Paddle's CUDA mocked here: this Paddle has none), each key covers its own sources, and a failing CUDA
build leaves the CPU ops built and loadable."""
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import fastdeploy  # noqa: F401  (before paddle)

from fastdeploy.model_executor.ops.loader import SETUP_OPS

ROOT = Path(__file__).resolve().parents[2]

ZEN4 = "model name: AMD EPYC 9654 96-Core Processor\nflags: fpu sse2 avx2 avx512f avx512_bf16"
SKYLAKE = "model name: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\nflags: fpu sse2 avx2 avx512f"
CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9654 96-Core Processor
flags\t\t: fpu sse2  avx2 avx512f
bogomips\t: 4800.00

processor\t: 1
model name\t: Some Other Core
flags\t\t: fpu
"""


def setup_ops():
    spec = importlib.util.spec_from_file_location("setup_ops_under_test", SETUP_OPS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_directory_depends_on_the_cpu():
    ops = setup_ops()
    zen4, skylake = ops.build_directory(lambda: ZEN4), ops.build_directory(lambda: SKYLAKE)

    assert zen4 != skylake
    assert ops.build_directory(lambda: ZEN4) == zen4  # the same CPU reuses its build
    assert zen4.parent == skylake.parent and len(zen4.name) == 16
    assert ops.build_directory(lambda: ZEN4 + " avx512_vnni") != zen4  # one more ISA flag: another build


def test_the_default_build_directory_is_keyed_by_this_machines_cpu():
    ops = setup_ops()
    assert ops.build_directory() == ops.build_directory(ops.cpu_description)
    assert ops.build_directory() != ops.build_directory(lambda: "a CPU this machine does not have")


def test_the_cpu_description_is_the_first_processors_model_and_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)

    assert setup_ops().cpu_description(cpuinfo) == "flags: fpu sse2 avx2 avx512f\nmodel name: AMD EPYC 9654 96-Core Processor"


def test_the_cpu_description_falls_back_to_platform_without_cpuinfo(tmp_path):
    ops = setup_ops()
    expected = f"processor: {platform.processor()}\nmachine: {platform.machine()}"
    assert ops.cpu_description(tmp_path / "absent") == expected
    (tmp_path / "empty").write_text("processor\t: 0\nbogomips\t: 1.0\n")  # none of the CPU lines
    assert ops.cpu_description(tmp_path / "empty") == expected


# ---- the CPU module and the GPU module are separate builds ------------------------------------------------------
def test_the_cpu_module_never_compiles_cuda_sources_even_where_paddle_has_cuda(monkeypatch, tmp_path):
    import paddle
    import paddle.utils.cpp_extension

    ops = setup_ops()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # build() makes its directory
    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: True)
    asked = {}
    monkeypatch.setattr(paddle.utils.cpp_extension, "load", lambda name, sources, **kwargs: asked.update(
        {name: [Path(source).name for source in sources]}))
    ops.build()
    ops.build(ops.GPU_OPS)

    cpu, gpu = asked["fastdeploy_ops"], asked["fastdeploy_gpu_ops"]
    assert ops.NAME == "fastdeploy_ops"
    assert cpu == sorted(path.name for path in (ROOT / "custom_ops" / "cpu_ops").glob("*.cc")) and "gguf_linear.cc" in cpu
    assert gpu == sorted(path.name for path in (ROOT / "custom_ops" / "gpu_ops").glob("*.cu")) and "sampling_op.cu" in gpu
    assert not any(name.endswith(".cu") for name in cpu)


def _edited_copy_keys(tmp_path, edit: str) -> tuple:
    """(CPU, GPU) build directories of a copy of custom_ops/ before and after appending a comment to `edit`."""
    copy = tmp_path / "custom_ops"
    shutil.copytree(ROOT / "custom_ops", copy, ignore=shutil.ignore_patterns("__pycache__"))
    spec = importlib.util.spec_from_file_location("setup_ops_copy", copy / "setup_ops.py")
    ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ops)

    def keys():
        return ops.build_directory(lambda: ZEN4), ops.build_directory(lambda: ZEN4, ops.GPU_OPS)

    before = keys()
    with open(copy / edit, "a") as f:
        f.write("\n// edited\n")
    return before, keys()


def test_each_modules_cache_key_covers_its_own_sources_only(tmp_path):
    for edit in ("gpu_ops/sampling_op.cu", "gpu_ops/gpu_common.cuh"):
        (cpu, gpu), (cpu_after, gpu_after) = _edited_copy_keys(tmp_path / edit.replace("/", "_"), edit)
        assert cpu_after == cpu and gpu_after != gpu, edit
    for edit in ("cpu_ops/sampling.cc", "cpu_ops/cpu_ops.h"):
        (cpu, gpu), (cpu_after, gpu_after) = _edited_copy_keys(tmp_path / edit.replace("/", "_"), edit)
        assert cpu_after != cpu and gpu_after == gpu, edit
    assert cpu != gpu


FAILING_GPU_BUILD = """
import json, runpy, sys
import fastdeploy
import paddle
import paddle.utils.cpp_extension as cpp_extension
from fastdeploy.model_executor.ops import loader

paddle.is_compiled_with_cuda = lambda: True  # as a CUDA build of Paddle would say
real_load = cpp_extension.load

def load(name, **kwargs):
    if name == "fastdeploy_gpu_ops":
        raise RuntimeError("nvcc fatal: simulated CUDA build failure")
    return real_load(name=name, **kwargs)

cpp_extension.load = load
runpy.run_path(str(loader.SETUP_OPS), run_name="__main__")
ops = loader.compiled_ops()
print(json.dumps({"compiled": ops is not None, "has_linear": hasattr(ops, "gguf_linear"),
                  "has_gpu_op": hasattr(ops, "sampling_gpu")}))
"""


def test_a_failing_cuda_build_leaves_the_cpu_ops_built_and_loadable():
    """README's `python custom_ops/setup_ops.py` where Paddle has CUDA and nvcc fails."""
    done = subprocess.run([sys.executable, "-c", FAILING_GPU_BUILD], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    ops = setup_ops()
    assert lines[-3] == f"custom ops: built in {ops.build_directory()}", done.stdout
    assert lines[-2].startswith("gpu ops: not built (RuntimeError: nvcc fatal: simulated CUDA build failure)")
    assert lines[-2].endswith("the CPU ops are unaffected")
    assert json.loads(lines[-1]) == {"compiled": True, "has_linear": True, "has_gpu_op": False}
