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
  token_bitmask
              bitwise equal to apply_token_bitmask of fastdeploy/model_executor/layers/sample/
              token_bitmask.py (loaded from its file). vocab a multiple of 32 and not, of 4 and not;
              fewer words than vocab / 32 and more; logits with -inf, +inf, -0.0 and NaN; words all
              allowed, all banned and random; m < rows with a permutation of rows; a misaligned
              logits pointer; m = 0; 32 x 151936.

Files beside this one (imported from this folder): harness_device.py (device memory, the library),
harness_common.py (element types, the results table), check_attention.py, check_padding.py,
check_penalties.py, check_sampling.py, check_token_bitmask.py (one op each), harness_bench.py
(--bench).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

from check_attention import check_attention
from check_padding import check_padding
from check_penalties import check_penalties
from check_sampling import check_sampling
from check_token_bitmask import check_token_bitmask
from harness_bench import bench
from harness_common import Table
from harness_device import Device, build_library, load_library


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
    check_token_bitmask(lib, device, rng, table)
    failures = table.failures()
    print(f"\n{len(table.rows) - failures} passed, {failures} failed")
    if args.bench:
        bench(lib, device, rng)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
