"""The GPU side of the harness: device memory (CuPy, else PyTorch) moved as raw bytes, and the
kernel library (build.sh harness) built, loaded through ctypes with its C signatures, and called.
"""
import ctypes
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE.parent / "build.sh"


class Device:
    def __init__(self):
        try:
            import cupy

            self.cupy, self.torch = cupy, None
            self.name = f"cupy {cupy.__version__}, {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}"
        except ImportError:
            import torch

            if not torch.cuda.is_available():
                raise SystemExit("neither CuPy nor a CUDA-enabled PyTorch is available")
            self.cupy, self.torch = None, torch
            self.name = f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}"
        self.keep = []  # device buffers stay alive until reset()

    def upload(self, array: np.ndarray) -> int:
        """Device copy of array; returns its address."""
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if self.cupy is not None:
            buffer = self.cupy.asarray(raw)
            address = buffer.data.ptr
        else:
            buffer = self.torch.from_numpy(raw.copy()).cuda()
            address = buffer.data_ptr()
        self.keep.append(buffer)
        return address

    def empty(self, shape, dtype) -> int:
        return self.upload(np.zeros(shape, dtype))

    def download(self, address: int, shape, dtype) -> np.ndarray:
        buffer = next(b for b in self.keep if self._address(b) == address)
        raw = self.cupy.asnumpy(buffer) if self.cupy is not None else buffer.cpu().numpy()
        return raw.view(dtype).reshape(shape)

    def _address(self, buffer) -> int:
        return buffer.data.ptr if self.cupy is not None else buffer.data_ptr()

    def reset(self):
        self.keep.clear()



def build_library(arch: str) -> Path:
    build_dir = Path(tempfile.mkdtemp(prefix="fd_gpu_ops_"))
    env = dict(os.environ, ARCHS=arch, BUILD_DIR=str(build_dir))
    subprocess.run(["bash", str(BUILD_SH), "harness"], check=True, env=env)
    return build_dir / "libfd_gpu_ops.so"


def load_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    P, I, I64, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    signatures = {
        "fd_append_attention": [P, P, P, P, P, I, P, P, P, I, I, I, I, I, I, I, I, F],
        "fd_get_padding_offset": [P, P, I, I, P, P, P],
        "fd_rebuild_padding": [P, P, I, I, P, I],
        "fd_token_penalty": [P, I64, P, P, P, I64, P, P, P],
        "fd_sample": [P, I, I, P, P, P, P, P, P, P],
        "fd_apply_token_bitmask": [P, I64, I64, P, I64, P, I64],
        "fd_synchronize": [],
    }
    for name, argtypes in signatures.items():
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = I
    lib.fd_error_string.argtypes = [I]
    lib.fd_error_string.restype = ctypes.c_char_p
    return lib


def check_call(lib, name: str, *args):
    """Calls lib.name(*args), then synchronizes; raises on a launch or asynchronous error."""
    for what, error in ((name, getattr(lib, name)(*args)), ("synchronize after " + name, lib.fd_synchronize())):
        if error != 0:
            raise RuntimeError(f"{what}: CUDA error {error} ({lib.fd_error_string(error).decode()})")

