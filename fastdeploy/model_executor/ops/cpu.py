"""Compiled CPU ops (custom_ops/cpu_ops/), built on first use with paddle.utils.cpp_extension.

`cpu_ops()` returns the extension module, or None when it cannot be built here (no compiler,
headers missing, ...): callers then use their pure-Paddle fallbacks, and the reason is logged once.
The build is cached under `$XDG_CACHE_HOME/fastdeploy/ops` (default `~/.cache`), keyed by the
sources, the flags and the Paddle version, so it costs ~15 s once per machine. `-march=native` is
safe because the build runs on the machine that uses it.
"""
import functools
import hashlib
import logging
import os
from pathlib import Path

logger = logging.getLogger("fastdeploy")

SOURCES = [Path(__file__).resolve().parents[3] / "custom_ops" / "cpu_ops" / "paged_attention.cc"]
CXX_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]


def _build_directory() -> Path:
    import paddle

    digest = hashlib.sha256(paddle.__version__.encode() + " ".join(CXX_FLAGS).encode())
    for source in SOURCES:
        digest.update(source.read_bytes())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "fastdeploy" / "ops" / digest.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def cpu_ops():
    """The compiled module (loaded once per process: a second load of the same ops aborts Paddle)."""
    try:
        from paddle.utils.cpp_extension import load

        if not all(s.is_file() for s in SOURCES):
            raise FileNotFoundError(f"op sources not found: {[str(s) for s in SOURCES]}")
        build_dir = _build_directory()
        build_dir.mkdir(parents=True, exist_ok=True)
        return load(name="fastdeploy_cpu_ops", sources=[str(s) for s in SOURCES], extra_cxx_cflags=CXX_FLAGS,
                    build_directory=str(build_dir), verbose=False)
    except Exception as e:  # any build failure means: run the fallbacks
        logger.warning("compiled CPU ops unavailable (%s: %s); using pure-Paddle fallbacks", type(e).__name__, e)
        return None
