"""CPU runtime settings: the AMD MKL fix, GNU OpenMP left alone, the thread count and glibc malloc, in fresh
interpreters."""
import os
import platform
import subprocess
import sys

from fastdeploy.platforms.cpu import _cpu_vendor, huge_page_ranges, usable_cores


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


HEAP_AFTER_FREE = """
import ctypes
import numpy as np
import fastdeploy
from fastdeploy.platforms.cpu import return_freed_memory, reuse_freed_memory
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
reuse_freed_memory()
block = np.ones(300 * 2**20, np.uint8)  # 300 MiB from the heap, every page touched
del block
kept = rss()
return_freed_memory()
print(kept - rss())
"""


def test_return_freed_memory_gives_the_kept_heap_back():
    """After reuse_freed_memory a freed 300 MiB block stays resident (the trim threshold is 1 GiB), as a
    model load's transient tensors would; return_freed_memory (run once a model is loaded) hands it back."""
    assert int(_run(HEAP_AFTER_FREE, {})) >= 250 * 2**20


MIB = 2**20


def test_huge_page_ranges_stay_inside_each_mapping_and_merge():
    """Extents widened to 2 MiB boundaries, clipped to the aligned interior of their mapping, touching
    ranges merged; an extent outside every mapping, or one crossing a mapping's end, is left out."""
    mappings = [(1 * MIB, 13 * MIB), (20 * MIB, 40 * MIB)]
    extents = [
        (1 * MIB + 4096, 3 * MIB),  # [1, 4.x) in a mapping whose aligned interior is [2, 12)
        (5 * MIB, 1 * MIB),         # [5, 6): widened to [4, 6), touches the first
        (11 * MIB, 2 * MIB),        # [11, 13): widened to [10, 14), clipped to [10, 12)
        (21 * MIB, 100),            # widened to [20, 22)
        (25 * MIB, 1 * MIB),        # widened to [24, 26): apart from [20, 22)
        (15 * MIB, 1 * MIB),        # in no mapping
        (39 * MIB, 2 * MIB),        # crosses its mapping's end
    ]
    assert huge_page_ranges(extents, mappings) == [
        (2 * MIB, 6 * MIB), (10 * MIB, 12 * MIB), (20 * MIB, 22 * MIB), (24 * MIB, 26 * MIB)]


COLLAPSE = """
import numpy as np, paddle
import fastdeploy
from fastdeploy.platforms.cpu import collapse_into_huge_pages
t = paddle.to_tensor(np.arange(48 * 2**20, dtype=np.uint8))
def huge_kib():  # AnonHugePages of the mapping holding t's data (/proc/self/smaps)
    inside, kib = False, 0
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(a, 16) for a in head.split("-"))
            inside = lo <= t.data_ptr() < hi
        elif inside and head == "AnonHugePages:":
            kib = int(line.split()[1])
    return kib
before = huge_kib()
collapsed = collapse_into_huge_pages([t])
same = bool((t.numpy() == np.arange(48 * 2**20, dtype=np.uint8)).all())
print(collapsed, (huge_kib() - before) * 1024, same)
"""


def test_collapse_into_huge_pages_moves_a_weight_into_huge_pages_as_reported():
    """What the function reports equals the growth of the mapping's AnonHugePages (the kernel's count),
    the data is unchanged, and on Linux >= 6.1 (MADV_COLLAPSE) a 48 MiB tensor gets at least 40 MiB of
    huge pages (its aligned interior is at least 46 MiB)."""
    collapsed, grown, same = _run(COLLAPSE, {}).split()
    assert int(collapsed) == int(grown) and same == "True"
    release = tuple(int(p) for p in platform.release().split(".")[:2])
    if release >= (6, 1):
        assert int(collapsed) >= 40 * MIB


def test_the_engine_holds_the_default_models_weights_in_huge_pages(smollm_llm):
    """Every engine's model runner collapses its parameters into huge pages at start (the greedy and
    parity tests run on those pages); on Linux >= 6.1 the 2 MiB pages collapsed cover at least 90% of the
    parameter bytes (they are counted whole, so neighbouring heap memory may add to them)."""
    runner = smollm_llm.llm_engine.executor.runner
    weights = sum(p.numel().item() * p.element_size() for p in runner.model.parameters())
    release = tuple(int(p) for p in platform.release().split(".")[:2])
    if release >= (6, 1):  # MADV_COLLAPSE exists
        assert runner.huge_page_bytes >= 0.9 * weights
