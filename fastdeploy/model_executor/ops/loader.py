"""The compiled custom ops (custom_ops/, built by custom_ops/setup_ops.py), or None for the fallbacks.

Where the op sources are (`SETUP_OPS`): inside the installed package, `fastdeploy/_custom_ops/`
(setup.py installs custom_ops/ there, so a wheel or a non-editable install carries them), else the
source checkout's `custom_ops/` beside the package (editable installs, running from a checkout).

`compiled_op(name)` is what the shims in this package call: the op from the `fastdeploy_ops`
extension module (the CPU ops, `setup_ops.CPU_OPS`), or None when the module is not available (no
compiler, no sources in this install, a failed build: the reason is logged once) or fallbacks are
forced. The CUDA kernels are another module, `fastdeploy_gpu_ops`, which the engine does not load:
it computes on the CPU, and a failed CUDA build never touches this one. Forcing fallbacks:
`FD_DISABLE_CUSTOM_OPS=1` in the environment (the whole process, e.g. to run the test suite on the
pure-Paddle paths) or `with fallbacks_forced():` (tests comparing both paths in one process).

A build left by an earlier process is imported directly (paddle's `load` would re-run its build
script, ~1.3 s per process); otherwise the module is compiled first, in a child process (~1-2 min
once per machine). Either way this process loads it with RTLD_DEEPBIND first (`_bind_first_to_paddle`).

Which OpenMP runtime runs the ops' threads once loaded here (Paddle's libiomp5), and what that rules
out in their sources: custom_ops/README.md, "OpenMP runtime".
"""
import contextlib
import fcntl
import functools
import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

logger = logging.getLogger("fastdeploy")

_PACKAGE = Path(__file__).resolve().parents[2]  # the fastdeploy package directory
SETUP_OPS_CANDIDATES = (_PACKAGE / "_custom_ops" / "setup_ops.py",  # installed with the package
                        _PACKAGE.parent / "custom_ops" / "setup_ops.py")  # a source checkout
SETUP_OPS = next((path for path in SETUP_OPS_CANDIDATES if path.is_file()), SETUP_OPS_CANDIDATES[-1])
_forced = [os.environ.get("FD_DISABLE_CUSTOM_OPS", "0") not in ("", "0")]


def _setup_ops():
    """setup_ops.py (SETUP_OPS: the installed copy, else the checkout's) as a module."""
    if not SETUP_OPS.is_file():
        looked = " and ".join(str(path) for path in SETUP_OPS_CANDIDATES)
        raise FileNotFoundError(f"this install has no op sources (looked for {looked})")
    spec = importlib.util.spec_from_file_location("fastdeploy_setup_ops", SETUP_OPS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_bound = []  # the module's RTLD_DEEPBIND handle, held for the process's lifetime


def _bind_first_to_paddle(library: Path) -> None:
    """Load the module's shared library with RTLD_DEEPBIND before Paddle imports it: its undefined
    symbols are then looked up in its own dependencies first (libpaddle.so's, where Paddle's libiomp5
    serves the OpenMP entry points), not in the process's global scope, where an `import torch` puts
    GNU libgomp (custom_ops/README.md, "OpenMP runtime")."""
    import ctypes

    _bound.append(ctypes.CDLL(str(library), mode=os.RTLD_NOW | getattr(os, "RTLD_DEEPBIND", 0)))


def _compile(setup_ops) -> None:
    """Compile the CPU module in a child process (`setup_ops.py --compile-only`), so that this process loads
    it the one way every later process does. Raises RuntimeError with the compiler's last output."""
    done = subprocess.run([sys.executable, str(SETUP_OPS), "--compile-only"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building {setup_ops.NAME} failed: {(done.stdout + done.stderr)[-2000:]}")


@functools.lru_cache(maxsize=1)
def _load():
    """Import (or build, then import) the extension once per process: loading the same ops twice aborts Paddle."""
    try:
        setup_ops = _setup_ops()
        directory = setup_ops.build_directory()
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "build.lock", "w") as lock:  # one process builds, the others wait for it
            fcntl.flock(lock, fcntl.LOCK_EX)
            built = directory / setup_ops.NAME
            library = built / f"{setup_ops.NAME}.so"
            if not library.is_file():
                logger.info("building the custom ops (%s), once per machine...", SETUP_OPS)
                _compile(setup_ops)
            from paddle.utils.cpp_extension.extension_utils import _import_module_from_library

            _bind_first_to_paddle(library)
            return _import_module_from_library(setup_ops.NAME, str(built))
    except Exception as e:  # any failure means: run the pure-Paddle fallbacks
        logger.warning("custom ops unavailable (%s: %s); using pure-Paddle fallbacks", type(e).__name__, e)
        return None


def compiled_ops():
    """The extension module, or None (not available, or fallbacks forced)."""
    return None if _forced[0] else _load()


def compiled_op(name: str) -> Optional[Callable]:
    """One compiled op by name, or None."""
    ops = compiled_ops()
    return getattr(ops, name, None) if ops is not None else None


@contextlib.contextmanager
def fallbacks_forced(forced: bool = True):
    """Within the block, every shim runs its pure-Paddle fallback (or, with False, the compiled op)."""
    previous, _forced[0] = _forced[0], forced
    try:
        yield
    finally:
        _forced[0] = previous
