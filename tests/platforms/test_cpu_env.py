"""CPU runtime settings: the AMD MKL fix, GNU OpenMP left alone, the thread count and glibc malloc, in fresh
interpreters."""
import os
import subprocess
import sys

from fastdeploy.platforms.cpu import _cpu_vendor, usable_cores


def _run(code: str, env_changes: dict) -> str:
    return _run_args(code, [], env_changes)


def _run_args(code: str, args: list, env_changes: dict) -> str:
    """The last line code prints in a fresh interpreter (argv[1:] = args), the CPU and malloc variables
    this module checks removed from the environment, then env_changes set."""
    removed = ("MKL_DEBUG_CPU_TYPE", "OMP_NUM_THREADS", "GOMP_SPINCOUNT", "LD_PRELOAD", "MALLOC_MMAP_MAX_",
               "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX")
    env = {k: v for k, v in os.environ.items() if k not in removed}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()[-1]


def test_mkl_fix_is_set_on_amd_only_and_never_overrides_the_user():
    code = "import os, fastdeploy; print(os.environ.get('MKL_DEBUG_CPU_TYPE'))"
    expected = "5" if _cpu_vendor() == "AuthenticAMD" else "None"
    assert _run(code, {}) == expected
    assert _run(code, {"MKL_DEBUG_CPU_TYPE": "2"}) == "2"


def test_engine_threads_follow_usable_cores_or_the_users_setting():
    code = ("import fastdeploy, paddle; from fastdeploy.platforms.cpu import set_paddle_threads; "
            "print(set_paddle_threads())")
    assert _run(code, {}) == str(usable_cores())
    assert _run(code, {"OMP_NUM_THREADS": "1"}) == "1"


def test_gnu_openmp_settings_are_left_as_the_user_has_them():
    """The engine's threads are Paddle's libiomp5 team; importing fastdeploy must not change how the
    user's torch (GNU libgomp) threads wait."""
    code = "import os, fastdeploy; print(os.environ.get('GOMP_SPINCOUNT'))"
    assert _run(code, {}) == "None"
    assert _run(code, {"GOMP_SPINCOUNT": "10000"}) == "10000"


MMAPPED_BYTES = """
import ctypes, sys
import numpy as np
import fastdeploy
from fastdeploy.platforms.cpu import reuse_freed_memory
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
changed = reuse_freed_memory() if sys.argv[1] == "engine" else None
before = libc.mallinfo2().hblkhd
block = np.ones(100 * 2**20, np.uint8)  # 100 MiB, above glibc's largest mmap threshold
print(changed, libc.mallinfo2().hblkhd - before)
"""


def test_the_engine_keeps_large_blocks_in_the_heap_unless_the_user_tuned_malloc():
    """glibc maps a 100 MiB block by itself (hblkhd: bytes in mmapped blocks, which it adds) by default; after
    reuse_freed_memory (what the engine's process runs at start) it comes from the heap, for reuse
    after it is freed; a MALLOC_* variable of the user's leaves malloc alone."""
    def run(mode, env):
        changed, mapped = _run_args(MMAPPED_BYTES, [mode], env).split()
        return changed, int(mapped)

    assert run("default", {})[1] >= 100 * 2**20
    assert run("engine", {}) == ("True", 0)
    changed, mapped = run("engine", {"MALLOC_ARENA_MAX": "2"})
    assert changed == "False" and mapped >= 100 * 2**20
