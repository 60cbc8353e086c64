"""OpenMP in the compiled ops (custom_ops/README.md, "OpenMP runtime"): loaded into Paddle, their
`#pragma omp` regions run on Paddle's Intel OpenMP runtime (libiomp5), also where torch was imported
first and put GNU libgomp in the global scope (the loader loads the module with RTLD_DEEPBIND).
libiomp5 lacks some of GCC's entry points (the `schedule(dynamic)` loops' GOMP_loop_nonmonotonic_*);
those would bind to libgomp, which does not know libiomp5's team, so every thread would run every
iteration.

Guards: the module imports no OpenMP entry point that libiomp5 lacks (read from the ELF symbol
tables with `nm`, the binutils beside the compiler that built the ops); the sampling op's row loop
(`ForEachRow` in sampling.cc, observed through its test-only op `fd_sampling_row_visits`) runs each
row exactly once on a team of the size set through Paddle (1, 2 and 3 threads: libgomp's team would
be one per core), here (torch imported first, as in a full test run) and in fresh processes with and
without torch imported before fastdeploy.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import fastdeploy  # noqa: F401  (before paddle)
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.ops import compiled_ops, fallbacks_forced
from fastdeploy.platforms.cpu import set_paddle_threads


@pytest.fixture(scope="module")
def ops():
    with fallbacks_forced(False):
        module = compiled_ops()
    assert module is not None, "the compiled ops are not built"
    return module


@pytest.fixture
def threads():
    """Sets Paddle's OpenMP thread count; restores the engine's choice afterwards."""
    yield paddle.base.core.set_num_threads
    set_paddle_threads()


def mapped_libraries() -> list[Path]:
    """Shared objects mapped into this process, from /proc/self/maps."""
    with open(f"/proc/{os.getpid()}/maps", encoding="utf-8") as f:
        return sorted({Path(line.split()[-1]) for line in f if ".so" in line.split()[-1]})


def dynamic_symbols(library: Path, undefined: bool) -> set[str]:
    flag = "--undefined-only" if undefined else "--defined-only"
    listing = subprocess.run(["nm", "-D", flag, str(library)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in listing.splitlines() if line.strip()}


def test_every_openmp_entry_point_of_the_ops_is_served_by_paddles_libiomp5(ops):
    libraries = mapped_libraries()
    module = [p for p in libraries if p.name == "fastdeploy_ops.so"]
    iomp = [p for p in libraries if p.name == "libiomp5.so"]
    assert len(module) == 1 and len(iomp) == 1, (module, iomp)
    assert "paddle" in str(iomp[0]), f"libiomp5 is not Paddle's: {iomp[0]}"  # the runtime README names
    needed = {s for s in dynamic_symbols(module[0], undefined=True) if s.startswith(("GOMP_", "omp_", "kmp_"))}
    assert "GOMP_parallel" in needed  # the ops do use OpenMP: the check below is not vacuous
    missing = needed - dynamic_symbols(iomp[0], undefined=False)
    assert not missing, f"libiomp5 lacks {sorted(missing)}: those bind to libgomp, outside libiomp5's team"


@pytest.mark.parametrize("asked", [1, 2, 3])
@pytest.mark.parametrize("rows", [1, 2, 7, 64])
def test_the_sampling_row_loop_runs_each_row_once(ops, threads, asked, rows):
    threads(asked)
    visits = ops.fd_sampling_row_visits(paddle.zeros([rows], "int64")).numpy()  # [rows, 3]

    assert visits.shape == (rows, 3)
    np.testing.assert_array_equal(visits[:, 0], 1)  # each row run exactly once across the team
    np.testing.assert_array_equal(visits[:, 2], asked)  # Paddle's setting: libiomp5's team
    assert ((visits[:, 1] >= 0) & (visits[:, 1] < asked)).all()


FRESH_PROCESS = """
import json, sys
if sys.argv[1] == "torch-first":
    import torch  # noqa: F401  (loads GNU libgomp RTLD_GLOBAL)
import fastdeploy, paddle
from fastdeploy.model_executor.ops import compiled_ops
ops, out = compiled_ops(), {}
for team in (1, 2, 3):
    paddle.base.core.set_num_threads(team)
    out[team] = [ops.fd_sampling_row_visits(paddle.zeros([rows], "int64")).numpy().tolist() for rows in (1, 7, 64)]
print(json.dumps(out))
"""


@pytest.mark.parametrize("first", ["fastdeploy-first", "torch-first"])
def test_the_ops_team_has_paddles_thread_count_and_runs_each_row_once_in_a_fresh_process(first):
    """With or without torch imported first, Paddle's libiomp5 serves the regions (the team is Paddle's
    setting, not libgomp's one thread per core)."""
    env = {k: v for k, v in os.environ.items() if k != "FD_DISABLE_CUSTOM_OPS"}  # this test is about the op
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, first], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2], env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    for team, runs in json.loads(done.stdout.strip().splitlines()[-1]).items():
        for visits in map(np.array, runs):
            np.testing.assert_array_equal(visits[:, 0], 1, err_msg=f"team {team}, {len(visits)} rows")
            np.testing.assert_array_equal(visits[:, 2], int(team))
