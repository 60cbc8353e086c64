"""get_padding_offset and rebuild_padding: exact, over batch sizes and lengths, every element type."""
import numpy as np

from harness_common import BF16, F16, F32, Table, to_storage
from harness_device import check_call


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

