"""token_bitmask: bitwise equal to apply_token_bitmask of fastdeploy/model_executor/layers/sample/token_bitmask.py."""
import importlib.util
from pathlib import Path

import numpy as np

from harness_common import Table
from harness_device import check_call

REFERENCE = Path(__file__).resolve().parents[3] / "fastdeploy/model_executor/layers/sample/token_bitmask.py"


def load_reference():
    """The engine's numpy reference, loaded from its file: importing the fastdeploy package needs Paddle."""
    spec = importlib.util.spec_from_file_location("token_bitmask_reference", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.apply_token_bitmask


def random_bitmask(rng, m: int, num_words: int) -> np.ndarray:
    """Words all banned (0), all allowed (-1) or random bits, a third each; row 0 all banned, row 1 all allowed."""
    words = rng.integers(-(2**31), 2**31, (m, num_words), dtype=np.int64).astype(np.int32)
    kind = rng.integers(0, 3, (m, num_words))
    words[kind == 0] = 0
    words[kind == 1] = -1
    words[:1] = 0
    words[1:2] = -1
    return words


def random_logits(rng, rows: int, vocab: int) -> np.ndarray:
    """Normal logits with -inf, +inf, -0.0 and a NaN with a payload sprinkled in (their bits must survive)."""
    logits = (rng.standard_normal((rows, vocab)) * 4).astype(np.float32)
    flat = logits.reshape(-1)
    for value in (-np.inf, np.inf, -0.0, np.uint32(0x7FC01234).view(np.float32)):
        flat[rng.choice(flat.size, max(1, flat.size // 100), replace=False)] = value
    return logits


# (rows, vocab, words, m, logits offset in floats): vocab a multiple of 32 and not, of 4 and not (the
# one-token path); fewer words than the vocabulary needs, more than it needs; m < rows (a permutation
# of rows); a misaligned logits pointer (the one-token path at vocab % 4 == 0); no bitmask rows; Qwen's vocab.
CASES = (
    (4, 4096, 128, 4, 0),
    (5, 1000, 32, 5, 0),
    (3, 1001, 32, 3, 0),
    (6, 3000, 50, 4, 0),
    (4, 1000, 40, 2, 0),
    (8, 32000, 1000, 5, 0),
    (4, 1000, 32, 4, 1),
    (3, 777, 25, 0, 0),
    (32, 151936, 4748, 32, 0),
)


def check_token_bitmask(lib, device, rng, table: Table):
    reference = load_reference()
    ok = True
    for rows, vocab, num_words, m, offset in CASES:
        logits = random_logits(rng, rows, vocab)
        bitmask = random_bitmask(rng, m, num_words)
        indices = rng.permutation(rows)[:m].astype(np.int64)
        expected = logits.copy()
        reference(expected, bitmask, indices)
        padded = np.concatenate([np.zeros(offset, np.float32), logits.reshape(-1)])
        base = device.upload(padded)
        check_call(lib, "fd_apply_token_bitmask", base + 4 * offset, rows, vocab, device.upload(bitmask), num_words,
                   device.upload(indices), m)
        got = device.download(base, padded.shape, np.float32)[offset:].reshape(rows, vocab)
        ok &= np.array_equal(got.view(np.uint32), expected.view(np.uint32))
        device.reset()
    table.add("token_bitmask (bitwise)", len(CASES), 0.0, 0.0, bool(ok))
