"""CPU runtime settings that decide speed on this kind of machine.

Two facts (measured on AMD EPYC Zen 4): Paddle's bundled MKL runs its slow generic path on AMD CPUs
unless `MKL_DEBUG_CPU_TYPE=5` is set *before* `import paddle` (fp32 GEMM ~75 -> ~200 GFLOP/s on
Zen 4), and `import paddle` pins its thread pool to one thread when `OMP_NUM_THREADS` is unset.
`prepare_environment()` runs from `fastdeploy/__init__.py` before anything imports paddle;
`set_paddle_threads()` and `reuse_freed_memory()` run when an engine starts, `return_freed_memory()`
once its model is loaded, and `collapse_into_huge_pages()` when a model runner gets its loaded model.
"""
import bisect
import ctypes
import functools
import logging
import os
import sys
from typing import Optional

logger = logging.getLogger(__name__)

_USER_OMP_THREADS = os.environ.get("OMP_NUM_THREADS")


@functools.cache  # asked once per vision linear at a VL model's build; the CPU does not change
def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def is_amd_cpu() -> bool:
    """True on AMD CPUs (`vendor_id` AuthenticAMD in /proc/cpuinfo), where Paddle's bundled MKL needs
    the settings of this module and row-blocked large GEMMs (models/ernie4_5_vl/vision.py)."""
    return _cpu_vendor() == "AuthenticAMD"


def prepare_environment() -> None:
    """Set `MKL_DEBUG_CPU_TYPE=5` on AMD CPUs unless the user set it or paddle is already imported.

    Our compiled ops run on Paddle's Intel OpenMP, as Paddle's own kernels do, whether or not torch
    was imported (custom_ops/README.md, "OpenMP runtime"), so no GNU OpenMP setting is needed here.
    """
    if "paddle" in sys.modules and _USER_OMP_THREADS == "1":
        logger.warning(
            "paddle was imported before fastdeploy and OMP_NUM_THREADS is 1 (paddle sets it on import), "
            "so the engine will compute on one thread. Import fastdeploy first to use every core."
        )
    if "MKL_DEBUG_CPU_TYPE" in os.environ or not is_amd_cpu():
        return
    if "paddle" in sys.modules:
        logger.warning(
            "paddle was imported before fastdeploy, so the AMD MKL fix (MKL_DEBUG_CPU_TYPE=5) cannot "
            "take effect: fp32 GEMM may run 2-3x slower. Import fastdeploy first or set the variable."
        )
        return
    os.environ["MKL_DEBUG_CPU_TYPE"] = "5"


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def engine_threads() -> int:
    """Threads the engine computes on: `OMP_NUM_THREADS` as the user set it before import, else one
    per usable core."""
    return int(_USER_OMP_THREADS) if _USER_OMP_THREADS else usable_cores()


def set_paddle_threads() -> int:
    """Give Paddle's CPU kernels `engine_threads()` threads; returns that count."""
    import paddle

    threads = engine_threads()
    paddle.base.core.set_num_threads(threads)
    return threads


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_GLIBC_MALLOC_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX")


def reuse_freed_memory() -> bool:
    """Make glibc malloc serve every allocation from its heaps and keep what is freed for reuse
    (`mallopt(M_MMAP_MAX, 0)`, `mallopt(M_TRIM_THRESHOLD, 1 GiB)`); True when set.

    By default glibc maps each allocation above 32 MB (its largest mmap threshold) freshly and unmaps it
    on free, so every such tensor costs page faults and the kernel zeroing its pages: a prefill's
    [tokens, 2 * intermediate] float32 activations, and ERNIE-4.5-VL's vision tower at 1024x1024
    ([5476, 5120] float32, 112 MB). Paddle's CPU allocator passes these to malloc. Kept in the heap they
    are reused, as tcmalloc or jemalloc would do, which vLLM-CPU asks its users to preload. The process keeps its peak
    heap instead of returning each large block at once. Nothing is changed where the user set one of
    glibc's MALLOC_* variables, preloaded another allocator (LD_PRELOAD), or the C library has no mallopt.
    """
    if any(name in os.environ for name in _GLIBC_MALLOC_VARIABLES) or os.environ.get("LD_PRELOAD"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def proc_bytes(path: str, key: str) -> Optional[int]:
    """Bytes in the `key:  N kB` line of a /proc file (/proc/meminfo, /proc/self/status); None where the
    file is unreadable (not Linux) or has no such line."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def return_freed_memory() -> None:
    """Give the heap's free pages back to the kernel (glibc `malloc_trim(0)`; nothing elsewhere).

    Called once a model is loaded (in process and on every tensor-parallel rank): loading passes whole
    checkpoint tensors through the process (sliced into shards, packed into bf16/int8/int4 panels), and
    `reuse_freed_memory` keeps up to 1 GiB of what is freed in the heap, so without this the process
    would keep its load-time peak, as large as the float weights it read."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


_MADV_COLLAPSE = 25  # linux/mman.h (Linux >= 6.1)
_HUGE_PAGE = 2 << 20  # x86-64 transparent huge page


def _mappings() -> list[tuple[int, int]]:
    """The process's memory mappings, [start, end) sorted by start (/proc/self/maps); [] where unreadable."""
    try:
        with open("/proc/self/maps", encoding="ascii") as f:
            return sorted(tuple(int(a, 16) for a in line.split(maxsplit=1)[0].split("-")) for line in f)
    except (OSError, ValueError):
        return []


def huge_page_ranges(extents: list[tuple[int, int]], mappings: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The 2 MiB-aligned ranges to collapse for data at `extents` ([(address, bytes)]): each extent widened
    to 2 MiB boundaries but kept inside the aligned interior of the mapping that holds it, overlapping or
    touching ranges merged. Extents outside every mapping are left out."""
    starts = [lo for lo, _ in mappings]
    ranges = []
    for address, size in extents:
        i = bisect.bisect_right(starts, address) - 1
        if i < 0 or address + size > mappings[i][1]:
            continue
        lo = max(address // _HUGE_PAGE, -(-mappings[i][0] // _HUGE_PAGE)) * _HUGE_PAGE
        hi = min(-(-(address + size) // _HUGE_PAGE), mappings[i][1] // _HUGE_PAGE) * _HUGE_PAGE
        if hi > lo:
            ranges.append((lo, hi))
    merged = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def collapse_into_huge_pages(tensors) -> int:
    """Back the memory of `tensors` with transparent huge pages, now: `madvise(..., MADV_COLLAPSE)` over
    each 2 MiB page of `huge_page_ranges` of their data (neighbouring memory of the same mapping included).
    Returns the bytes collapsed.

    Decode streams every weight from memory each step. With 4 KiB pages, the hardware prefetchers stop at
    each page boundary and each page costs a TLB entry; with 2 MiB pages the same kernels read faster
    (benchmarks/README.md at commit 9c89004, "Huge pages"). THP is often "madvise" only, so tensors
    Paddle allocated are in 4 KiB pages; MADV_COLLAPSE (Linux 6.1) moves the pages already written into huge pages synchronously,
    whatever the system setting. Where the kernel refuses (older kernels, THP disabled for the process, no
    free 2 MiB page), nothing changes and that page counts 0 bytes."""
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    extents = [(t.data_ptr(), t.numel().item() * t.element_size()) for t in tensors]
    pages = [page for lo, hi in huge_page_ranges(extents, _mappings()) for page in range(lo, hi, _HUGE_PAGE)]
    return _HUGE_PAGE * sum(madvise(page, _HUGE_PAGE, _MADV_COLLAPSE) == 0 for page in pages)  # one refusal loses one page
