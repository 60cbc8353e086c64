"""A real API server for tests: `python -m fastdeploy.entrypoints.openai.api_server` on 127.0.0.1.

    with RunningServer("--max-model-len", "512") as server:
        client = server.client()                     # the official openai client
        client.completions.create(model=server.model, prompt="Hi", max_tokens=4)
        server.terminate()                           # SIGTERM; returns the exit status

The server runs the default model unless the arguments name another. Its output goes to a log file
whose tail is shown when it fails to start.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import httpx

REPO = Path(__file__).resolve().parents[3]
START_TIMEOUT = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    def __init__(self, *args: str, env: Optional[dict] = None, model: str = "default"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = model
        self.log = tempfile.NamedTemporaryFile("w+", prefix="fd-server-", suffix=".log", delete=False)
        command = [sys.executable, "-m", "fastdeploy.entrypoints.openai.api_server", "--host", "127.0.0.1",
                   "--port", str(self.port), "--disable-uvicorn-access-log", *args]
        self.process = subprocess.Popen(command, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})}, start_new_session=True)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        end = time.monotonic() + START_TIMEOUT
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"the server did not become healthy in {START_TIMEOUT} s:\n{self.log_tail()}")

    def client(self, **kwargs):
        import openai

        kwargs.setdefault("api_key", "none")
        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.url + "/v1", **kwargs)

    def async_client(self, **kwargs):
        import openai

        kwargs.setdefault("api_key", "none")
        kwargs.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=self.url + "/v1", **kwargs)

    def log_tail(self, chars: int = 4000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 120.0) -> int:
        """Send `sig` and wait for the exit status."""
        self.process.send_signal(sig)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            try:
                self.terminate(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()
        os.unlink(self.log.name)
