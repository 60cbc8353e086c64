"""token_penalty: bitwise equal to the rule of fastdeploy/model_executor/layers/sample/penalties.py."""
import numpy as np

from harness_common import Table
from harness_device import check_call


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

