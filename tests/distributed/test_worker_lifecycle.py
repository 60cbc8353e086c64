"""No tensor-parallel worker outlives its engine process, however that process ends.

Each case runs an engine in a child Python process (tests/distributed/engine_script.py) and checks
the worker pids it printed: the script returning without shutdown() (interpreter exit), Ctrl-C
during a generate (SIGINT to the engine's process group, as a terminal sends it), and the engine
SIGKILLed during a generate (nothing of it runs any more: the workers see their socket close).
"""
import os
import signal
import subprocess
import sys
import time

import pytest

import fastdeploy

from test_tensor_parallel import alive
from tiny_llama import make_tiny_llama

SCRIPT = os.path.join(os.path.dirname(__file__), "engine_script.py")
GONE_WITHIN_S = 15


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama_lifecycle")
    make_tiny_llama(path)
    return str(path)


def start(model: str, mode: str):
    """The engine process and its workers' pids (read from its first line of output)."""
    root = os.path.dirname(os.path.dirname(fastdeploy.__file__))  # this checkout's fastdeploy
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, SCRIPT, model, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("pids"), (line, proc.wait() is not None and proc.stderr.read())
    pids = [int(p) for p in line.split()[1:]]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    return proc, pids


def wait_gone(pids, seconds=GONE_WITHIN_S) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_interpreter_exit_without_shutdown(tiny_llama):
    proc, pids = start(tiny_llama, "exit")
    assert proc.wait(GONE_WITHIN_S) == 0, proc.stderr.read()
    assert wait_gone(pids)


def test_ctrl_c_during_generate(tiny_llama):
    proc, pids = start(tiny_llama, "generate")
    assert proc.stdout.readline().strip() == "generating"
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)  # the workers run in their own session: only the engine gets it
    code = proc.wait(GONE_WITHIN_S)
    assert code != 0 and "KeyboardInterrupt" in proc.stderr.read()
    assert wait_gone(pids)


def test_engine_sigkilled_during_generate(tiny_llama):
    proc, pids = start(tiny_llama, "generate")
    assert proc.stdout.readline().strip() == "generating"
    time.sleep(1.0)
    proc.kill()
    proc.wait()
    assert wait_gone(pids), "workers outlived a SIGKILLed engine"
