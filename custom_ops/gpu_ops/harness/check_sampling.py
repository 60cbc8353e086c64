"""sampling: token ids equal to a sort-based numpy reference of sampling_kernel.cuh's rule, and the
same on a second run.
"""
import numpy as np

from harness_common import Table
from harness_device import check_call


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

