"""GPU check of custom_ops/gpu_ops: the kernels, built with nvcc into a shared library (build.sh
harness), run through ctypes on random ragged inputs and compared with numpy references.

    python custom_ops/gpu_ops/harness/run_gpu_tests.py [--lib PATH] [--arch 90] [--seed 0] [--bench]

Needs an NVIDIA GPU, nvcc, numpy, and CuPy or PyTorch (device memory only); no Paddle. Prints one
row per check (cases, max error, tolerance, result) and exits 1 when any check fails. Not a pytest
module (outside tests/, no test_ prefix): nothing in the test suite needs a GPU.

Checks and tolerances:
  attention   the cache after the write must equal the expected one bitwise; out against a float64
              numpy reference computed from the same (rounded) inputs: max |error| <= 1e-4 (float32),
              4e-3 (float16), 3e-2 (bfloat16). GQA ratios 1, 3, 8; head_dim 64, 128; block sizes 16
              and 64; int32 and int64 block tables; decodes, prefills, chunked prefills and an empty
              request in one ragged batch, lengths crossing block and 32-key tile boundaries.
  padding     get_padding_offset and rebuild_padding: exact.
  penalties   bitwise equal to the rule of fastdeploy/model_executor/layers/sample/penalties.py.
  sampling    token ids equal to a sort-based numpy reference of the kernel's rule (see
              sampling_kernel.cuh; weights rounded from a float64 exp, as the kernel does), and
              identical on a second run. Ties, -inf (banned) logits, min-p, top-k, top-p, greedy.
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE.parent / "build.sh"
F32, F16, BF16 = 0, 1, 2
DTYPE_NAMES = {F32: "f32", F16: "f16", BF16: "bf16"}
ATTENTION_TOL = {F32: 1e-4, F16: 4e-3, BF16: 3e-2}


# ---- device memory (CuPy, else PyTorch), moved as raw bytes -------------------------------------
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


# ---- the library ---------------------------------------------------------------------------------
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


# ---- element types ------------------------------------------------------------------------------
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


# ---- results table ------------------------------------------------------------------------------
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


# ---- append attention ----------------------------------------------------------------------------
def ragged_requests(rng, block_size: int) -> list:
    """(query tokens, cached tokens) per request: decodes, prefills, a chunked prefill, an empty slot;
    lengths land on and next to block and 32-key tile boundaries."""
    return [
        (1, int(rng.integers(0, 300))),
        (1, block_size - 1),  # the new token opens a block
        (1, 64),  # 32-key tile boundary
        (int(rng.integers(2, 80)), 0),
        (int(rng.integers(30, 45)), int(rng.integers(1, 100))),
        (0, int(rng.integers(0, 40))),  # a slot with nothing scheduled this step
        (33, 31),
        (int(rng.integers(1, 5)), int(rng.integers(100, 200))),
    ]


def attention_inputs(rng, requests, heads, kv_heads, head_dim, block_size):
    query_lens = np.array([q for q, _ in requests], np.int32)
    history = np.array([h for _, h in requests], np.int32)
    blocks_needed = -(-(query_lens + history) // block_size)
    max_blocks = int(blocks_needed.max()) + 2
    num_blocks = int(blocks_needed.sum()) + 3
    pool = rng.permutation(num_blocks)
    tables = np.full((len(requests), max_blocks), -1, np.int64)
    start = 0
    for i, count in enumerate(blocks_needed):
        tables[i, :count] = pool[start : start + count]
        start += count
    cu = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    slots = []
    for i, (q, h) in enumerate(requests):
        positions = h + np.arange(q)
        slots.append(tables[i, positions // block_size] * block_size + positions % block_size)
    slot_mapping = np.concatenate(slots).astype(np.int64)
    n = int(cu[-1])
    qkv = rng.standard_normal((n, (heads + 2 * kv_heads) * head_dim)).astype(np.float32)
    cache_shape = (num_blocks, kv_heads, block_size, head_dim)
    key_cache = rng.standard_normal(cache_shape).astype(np.float32)
    value_cache = rng.standard_normal(cache_shape).astype(np.float32)
    return qkv, key_cache, value_cache, slot_mapping, tables, cu, history


def write_cache_reference(qkv, key_cache, value_cache, slot_mapping, heads, kv_heads, head_dim):
    """Caches [num_blocks, kv_heads, block_size, head_dim] after this step's K/V writes (copies)."""
    key_cache, value_cache = key_cache.copy(), value_cache.copy()
    block_size = key_cache.shape[2]
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].reshape(-1, kv_heads, head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim :].reshape(-1, kv_heads, head_dim)
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    key_cache[blocks, :, offsets] = k
    value_cache[blocks, :, offsets] = v
    return key_cache, value_cache


def attention_reference(qkv, key_cache, value_cache, tables, cu, history, heads, kv_heads, head_dim, scale):
    """out [num_tokens, heads * head_dim], float64: causal softmax attention per request (GQA)."""
    group, block_size = heads // kv_heads, key_cache.shape[2]
    q_all = qkv[:, : heads * head_dim].astype(np.float64).reshape(-1, kv_heads, group, head_dim)
    out = np.zeros((qkv.shape[0], heads * head_dim))
    for i in range(len(history)):
        a, b = int(cu[i]), int(cu[i + 1])
        if a == b:
            continue
        length = int(history[i]) + b - a
        blocks = tables[i, : -(-length // block_size)]
        k = key_cache[blocks].astype(np.float64).transpose(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)[:, :length]
        v = value_cache[blocks].astype(np.float64).transpose(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)[:, :length]
        scores = np.einsum("tkgd,kld->tkgl", q_all[a:b], k) * scale  # [t, kv_heads, group, length]
        visible = np.arange(length)[None, :] <= int(history[i]) + np.arange(b - a)[:, None]  # [t, length]
        scores = np.where(visible[:, None, None, :], scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        out[a:b] = np.einsum("tkgl,kld->tkgd", probs, v).reshape(b - a, heads * head_dim)
    return out


def run_attention_case(lib, device, rng, dtype, heads, kv_heads, head_dim, block_size, tables_int64):
    requests = ragged_requests(rng, block_size)
    qkv, key_cache, value_cache, slot_mapping, tables, cu, history = attention_inputs(
        rng, requests, heads, kv_heads, head_dim, block_size)
    # the reference sees exactly the rounded values the kernel reads
    qkv_s, key_s, value_s = (to_storage(x, dtype) for x in (qkv, key_cache, value_cache))
    qkv_r, key_r, value_r = (from_storage(x, dtype) for x in (qkv_s, key_s, value_s))
    exp_key, exp_value = write_cache_reference(qkv_r, key_r, value_r, slot_mapping, heads, kv_heads, head_dim)
    scale = head_dim**-0.5
    expected = attention_reference(qkv_r, exp_key, exp_value, tables, cu, history, heads, kv_heads, head_dim, scale)

    n, st = qkv.shape[0], storage_dtype(dtype)
    d_key, d_value = device.upload(key_s), device.upload(value_s)
    d_out = device.empty((n, heads * head_dim), st)
    d_tables = device.upload(tables if tables_int64 else tables.astype(np.int32))
    check_call(lib, "fd_append_attention", device.upload(qkv_s), d_key, d_value, device.upload(slot_mapping),
               d_tables, int(tables_int64), device.upload(cu), device.upload(history), d_out, dtype, n,
               len(requests), heads, kv_heads, head_dim, block_size, tables.shape[1], scale)
    got_key = from_storage(device.download(d_key, key_s.shape, st), dtype)
    got_value = from_storage(device.download(d_value, value_s.shape, st), dtype)
    got = from_storage(device.download(d_out, (n, heads * head_dim), st), dtype)
    device.reset()
    cache_ok = np.array_equal(got_key, exp_key) and np.array_equal(got_value, exp_value)
    return float(np.abs(got - expected).max()), cache_ok


def check_attention(lib, device, rng, table: Table):
    for dtype in (F32, F16, BF16):
        for heads, kv_heads in ((4, 4), (6, 2), (16, 2)):  # GQA ratios 1, 3, 8
            for head_dim in (64, 128):
                for block_size, tables_int64 in ((16, False), (64, True)):
                    if dtype != F32 and block_size == 16:
                        continue  # the half types share every index path with float32
                    error, cache_ok = run_attention_case(lib, device, rng, dtype, heads, kv_heads, head_dim,
                                                         block_size, tables_int64)
                    tol = ATTENTION_TOL[dtype]
                    name = (f"attention {DTYPE_NAMES[dtype]} H{heads}/KV{kv_heads} D{head_dim} "
                            f"bs{block_size} {'i64' if tables_int64 else 'i32'}")
                    table.add(name, 1, error, tol, error <= tol and cache_ok)
                    if not cache_ok:
                        print(f"  {name}: the KV cache after the write differs from the expected one")


# ---- padding -------------------------------------------------------------------------------------
def check_padding(lib, device, rng, table: Table):
    worst, ok, cases = 0.0, True, 0
    for batch_size, max_len in ((1, 1), (5, 17), (300, 40), (7, 1000)):
        seq_lens = rng.integers(0, max_len + 1, batch_size).astype(np.int32)
        seq_lens[0] = max_len
        input_ids = rng.integers(0, 50000, (batch_size, max_len)).astype(np.int64)
        cu = np.concatenate([[0], np.cumsum(seq_lens)]).astype(np.int32)
        n = int(cu[-1])
        ids_expected = np.concatenate([input_ids[i, : seq_lens[i]] for i in range(batch_size)])
        offsets_expected = np.repeat(np.arange(batch_size) * max_len - cu[:-1], seq_lens).astype(np.int32)
        d_ids, d_off = device.empty(n, np.int64), device.empty(n, np.int32)
        d_cu = device.empty(batch_size + 1, np.int32)
        check_call(lib, "fd_get_padding_offset", device.upload(input_ids), device.upload(seq_lens), batch_size,
                   max_len, d_ids, d_off, d_cu)
        ok &= np.array_equal(device.download(d_ids, n, np.int64), ids_expected)
        ok &= np.array_equal(device.download(d_off, n, np.int32), offsets_expected)
        ok &= np.array_equal(device.download(d_cu, batch_size + 1, np.int32), cu)
        # padded position of packed token k is k + padding_offset[k]
        ok &= np.array_equal(input_ids.reshape(-1)[np.arange(n) + offsets_expected], ids_expected)
        device.reset()
        for dtype in (F32, F16, BF16):
            hidden = to_storage(rng.standard_normal((n, 96)), dtype)
            expected = np.zeros((batch_size, 96), hidden.dtype)
            has_tokens = seq_lens > 0
            expected[has_tokens] = hidden[cu[1:][has_tokens] - 1]
            d_out = device.empty((batch_size, 96), hidden.dtype)
            check_call(lib, "fd_rebuild_padding", device.upload(hidden), device.upload(cu), batch_size, 96, d_out,
                       dtype)
            got = device.download(d_out, (batch_size, 96), hidden.dtype)
            ok &= np.array_equal(got.view(np.uint8), expected.view(np.uint8))
            device.reset()
            cases += 1
    table.add("get_padding_offset + rebuild_padding", cases, worst, 0.0, bool(ok))


# ---- penalties -----------------------------------------------------------------------------------
def penalty_reference(logits, rows, token_ids, counts, repetition, frequency, presence):
    """The rule of penalties.py, float32 throughout, on a copy."""
    out = logits.copy()
    values = out[rows, token_ids]
    rep = repetition[rows]
    values = np.where(values > 0, values / rep, values * rep)
    values -= frequency[rows] * counts + presence[rows] * (counts > 0)
    out[rows, token_ids] = values
    return out


def check_penalties(lib, device, rng, table: Table):
    ok, cases = True, 0
    for num_rows, vocab in ((1, 100), (9, 32000), (40, 151936)):
        logits = (rng.standard_normal((num_rows, vocab)) * 4).astype(np.float32)
        rows, ids = [], []
        for r in range(num_rows):
            seen = rng.choice(vocab, int(rng.integers(0, min(vocab, 300))), replace=False)
            rows.append(np.full(len(seen), r))
            ids.append(seen)
        rows, ids = np.concatenate(rows).astype(np.int64), np.concatenate(ids).astype(np.int64)
        counts = rng.integers(0, 6, len(rows)).astype(np.float32)
        repetition = rng.choice([1.0, 1.3, 0.7], num_rows).astype(np.float32)
        frequency = rng.choice([0.0, 0.2, 1.1], num_rows).astype(np.float32)
        presence = rng.choice([0.0, 0.5, -0.3], num_rows).astype(np.float32)
        expected = penalty_reference(logits, rows, ids, counts, repetition, frequency, presence)
        d_logits = device.upload(logits)
        check_call(lib, "fd_token_penalty", d_logits, vocab, device.upload(rows), device.upload(ids),
                   device.upload(counts), len(rows), device.upload(repetition), device.upload(frequency),
                   device.upload(presence))
        ok &= np.array_equal(device.download(d_logits, logits.shape, np.float32).view(np.uint32),
                             expected.view(np.uint32))
        device.reset()
        cases += 1
    table.add("token_penalty (bitwise)", cases, 0.0, 0.0, bool(ok))


# ---- sampling ------------------------------------------------------------------------------------
def sample_reference(logits, temperature, top_k, top_p, min_p, u) -> int:
    """One row by the rule in sampling_kernel.cuh, with a full stable sort."""
    if not temperature > 0:
        return int(np.argmax(logits))
    x = logits / np.float32(temperature)
    w = np.exp((x - x.max()).astype(np.float64)).astype(np.float32)  # rounded once, as the kernel
    if min_p > 0:
        w[w < np.float32(min_p)] = 0
    if top_k <= 0 and top_p >= 1:
        cdf = np.cumsum(w.astype(np.float64))
        i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        return min(i, int(np.flatnonzero(w)[-1]))
    order = np.argsort(-w, kind="stable")
    order = order[w[order] > 0]
    if top_k > 0:
        order = order[:top_k]
    values = w[order].astype(np.float64)
    if top_p < 1:
        before = np.cumsum(values) - values
        keep = before < float(np.float32(top_p)) * values.sum()
        keep[0] = True
        order, values = order[keep], values[keep]
    cdf = np.cumsum(values)
    return int(order[min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(order) - 1)])


def sampling_batch(rng, num_rows: int, vocab: int):
    kinds = rng.integers(0, 4, num_rows)
    logits = (rng.standard_normal((num_rows, vocab)) * 3).astype(np.float32)
    for r, kind in enumerate(kinds):
        if kind == 1:  # many exact ties
            logits[r] = rng.integers(-4, 4, vocab)
        elif kind == 2:  # banned tokens
            logits[r, rng.random(vocab) < 0.3] = -np.inf
        elif kind == 3:  # peaked
            logits[r, rng.integers(vocab)] += 25
    temperature = rng.choice([0.0, 0.3, 1.0, 1.5], num_rows).astype(np.float32)
    top_k = rng.choice([0, 0, 1, 7, 50, 1000, 10**9], num_rows).astype(np.int64)
    top_p = rng.choice([1.0, 1.0, 0.95, 0.5, 0.05], num_rows).astype(np.float32)
    min_p = rng.choice([0.0, 0.0, 0.02, 0.3], num_rows).astype(np.float32)
    uniforms = rng.random(num_rows)
    uniforms[: min(2, num_rows)] = [0.0, 1 - 2**-40][: min(2, num_rows)]
    return logits, temperature, top_k, top_p, min_p, uniforms


def run_sampling(lib, device, batch) -> np.ndarray:
    logits, temperature, top_k, top_p, min_p, uniforms = batch
    num_rows, vocab = logits.shape
    d_tokens = device.empty(num_rows, np.int64)
    check_call(lib, "fd_sample", device.upload(logits), num_rows, vocab, device.upload(temperature),
               device.upload(top_k), device.upload(top_p), device.upload(min_p), device.upload(uniforms),
               device.empty((num_rows, vocab), np.float32), d_tokens)
    tokens = device.download(d_tokens, num_rows, np.int64).copy()
    device.reset()
    return tokens


def check_sampling(lib, device, rng, table: Table):
    for num_rows, vocab in ((200, 37), (200, 1000), (120, 32000), (40, 151936)):
        batch = sampling_batch(rng, num_rows, vocab)
        got = run_sampling(lib, device, batch)
        again = run_sampling(lib, device, batch)
        expected = np.array([sample_reference(batch[0][r], *(b[r] for b in batch[1:])) for r in range(num_rows)])
        mismatches = int((got != expected).sum())
        for r in np.flatnonzero(got != expected)[:5]:
            print(f"  row {r}: got {got[r]}, expected {expected[r]} (temperature {batch[1][r]}, top_k {batch[2][r]}, "
                  f"top_p {batch[3][r]}, min_p {batch[4][r]}, u {batch[5][r]})")
        table.add(f"sampling vocab {vocab} (mismatched rows)", num_rows, mismatches, 0,
                  mismatches == 0 and np.array_equal(got, again))


# ---- timings -------------------------------------------------------------------------------------
def time_call(lib, name: str, args, repeats: int = 20) -> float:
    """Microseconds per call (launch + kernel, synchronized at the end)."""
    check_call(lib, name, *args)
    start = time.perf_counter()
    for _ in range(repeats):
        getattr(lib, name)(*args)
    check_call(lib, "fd_synchronize")
    return (time.perf_counter() - start) / repeats * 1e6


def bench(lib, device, rng):
    print("\ntimings (us per call)")
    for dtype, batch, context, query in ((F16, 64, 1024, 1), (F32, 64, 1024, 1), (F16, 1, 0, 2048)):
        heads, kv_heads, head_dim, block_size = 16, 2, 128, 64
        requests = [(query, context)] * batch
        qkv, key, value, slots, tables, cu, history = attention_inputs(rng, requests, heads, kv_heads, head_dim,
                                                                       block_size)
        n, st = qkv.shape[0], storage_dtype(dtype)
        args = (device.upload(to_storage(qkv, dtype)), device.upload(to_storage(key, dtype)),
                device.upload(to_storage(value, dtype)), device.upload(slots), device.upload(tables), 1,
                device.upload(cu), device.upload(history), device.empty((n, heads * head_dim), st), dtype, n, batch,
                heads, kv_heads, head_dim, block_size, tables.shape[1], head_dim**-0.5)
        us = time_call(lib, "fd_append_attention", args)
        kv_bytes = 2 * batch * (context + query) * kv_heads * head_dim * np.dtype(st).itemsize
        print(f"  append_attention {DTYPE_NAMES[dtype]} batch {batch} context {context} query {query} "
              f"H{heads}/KV{kv_heads} D{head_dim}: {us:.1f} us, KV read {kv_bytes / us / 1e3:.1f} GB/s")
        device.reset()
    for label, top_k, top_p in (("greedy", 0, 1.0), ("top-k 50 + top-p 0.9", 50, 0.9), ("top-p 0.9", 0, 0.9),
                                ("full distribution", 0, 1.0)):
        rows, vocab = 64, 151936
        logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
        temperature = np.full(rows, 0.0 if label == "greedy" else 0.8, np.float32)
        args = (device.upload(logits), rows, vocab, device.upload(temperature),
                device.upload(np.full(rows, top_k, np.int64)), device.upload(np.full(rows, top_p, np.float32)),
                device.upload(np.zeros(rows, np.float32)), device.upload(rng.random(rows)),
                device.empty((rows, vocab), np.float32), device.empty(rows, np.int64))
        print(f"  sampling {rows} x {vocab} {label}: {time_call(lib, 'fd_sample', args):.1f} us")
        device.reset()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", type=Path, help="a libfd_gpu_ops.so built by build.sh (default: build one now)")
    parser.add_argument("--arch", default="native", help="nvcc GPU architecture, e.g. 90 (default: native)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bench", action="store_true", help="also print kernel timings")
    args = parser.parse_args()
    device = Device()
    lib = load_library(args.lib or build_library(args.arch))
    print(f"device: {device.name}")
    rng = np.random.default_rng(args.seed)
    table = Table()
    table.header()
    check_attention(lib, device, rng, table)
    check_padding(lib, device, rng, table)
    check_penalties(lib, device, rng, table)
    check_sampling(lib, device, rng, table)
    failures = table.failures()
    print(f"\n{len(table.rows) - failures} passed, {failures} failed")
    if args.bench:
        bench(lib, device, rng)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
