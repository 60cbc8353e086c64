"""CPU runtime settings: the AMD MKL fix, GNU OpenMP left alone, and the thread count, in fresh interpreters."""
import os
import subprocess
import sys

from fastdeploy.platforms.cpu import _cpu_vendor, usable_cores


def _run(code: str, env_changes: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_DEBUG_CPU_TYPE", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()[-1]


def test_mkl_fix_is_set_on_amd_only_and_never_overrides_the_user():
    code = "import os, fastdeploy; print(os.environ.get('MKL_DEBUG_CPU_TYPE'))"
    expected = "5" if _cpu_vendor() == "AuthenticAMD" else "None"
    assert _run(code, {}) == expected
    assert _run(code, {"MKL_DEBUG_CPU_TYPE": "2"}) == "2"


def test_engine_threads_follow_usable_cores_or_the_users_setting():
    code = ("import fastdeploy, paddle; from fastdeploy.platforms.cpu import set_paddle_threads; "
            "print(set_paddle_threads())")
    assert _run(code, {}) == str(usable_cores())
    assert _run(code, {"OMP_NUM_THREADS": "1"}) == "1"


def test_gnu_openmp_settings_are_left_as_the_user_has_them():
    """The engine's threads are Paddle's libiomp5 team; importing fastdeploy must not change how the
    user's torch (GNU libgomp) threads wait."""
    code = "import os, fastdeploy; print(os.environ.get('GOMP_SPINCOUNT'))"
    assert _run(code, {}) == "None"
    assert _run(code, {"GOMP_SPINCOUNT": "10000"}) == "10000"
