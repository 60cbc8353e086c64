"""What every check of the harness uses: the kernels' element types (float32 values to and from
their storage: float32, float16, bfloat16 bits) and the results table.
"""
import numpy as np

F32, F16, BF16 = 0, 1, 2
DTYPE_NAMES = {F32: "f32", F16: "f16", BF16: "bf16"}


def to_storage(x: np.ndarray, dtype: int) -> np.ndarray:
    """float32 values -> the kernel's storage (float32, float16, or bfloat16 bits as uint16)."""
    x = np.asarray(x, np.float32)
    if dtype == F32:
        return x
    if dtype == F16:
        return x.astype(np.float16)
    bits = x.view(np.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF  # round to nearest even
    return ((bits + rounding) >> 16).astype(np.uint16)


def from_storage(x: np.ndarray, dtype: int) -> np.ndarray:
    if dtype == BF16:
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def storage_dtype(dtype: int):
    return {F32: np.float32, F16: np.float16, BF16: np.uint16}[dtype]



class Table:
    def __init__(self):
        self.rows = []

    def add(self, name: str, cases: int, error: float, tol: float, ok: bool):
        self.rows.append((name, cases, error, tol, ok))
        print(f"{name:<46} {cases:>6} {error:>10.3g} {tol:>9.3g}  {'pass' if ok else 'FAIL'}", flush=True)

    def header(self):
        print(f"{'check':<46} {'cases':>6} {'max_err':>10} {'tol':>9}  result")

    def failures(self) -> int:
        return sum(not ok for *_, ok in self.rows)

