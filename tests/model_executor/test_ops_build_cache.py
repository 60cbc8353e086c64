"""The op build cache (custom_ops/setup_ops.py, build_directory) is keyed by the CPU: the build uses
-march=native, so a cache shared between machines (NFS home, a moved container image) must not hand a
build for one CPU to another (SIGILL on an instruction the other lacks)."""
import importlib.util
import platform

import fastdeploy  # noqa: F401  (before paddle)

from fastdeploy.model_executor.ops.loader import SETUP_OPS

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
