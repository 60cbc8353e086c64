"""Fixtures of the API tests: a hang guard and a refusal to load models."""
import signal

import pytest

from fastdeploy.engine.engine import LLMEngine

HANG_LIMIT_S = 120  # a test module may set its own HANG_LIMIT_S


@pytest.fixture
def no_hang(request):
    """Fail (instead of hanging) when a test runs longer than HANG_LIMIT_S (or its own alarm)."""

    def on_alarm(signum, frame):
        raise TimeoutError("still running at its time limit: it hangs")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(getattr(request.module, "HANG_LIMIT_S", HANG_LIMIT_S))
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def no_loading(monkeypatch):
    """Make loading a model fail loudly: settings errors must come before it."""

    def refuse(cls, args):
        raise AssertionError("the model was being loaded although the arguments are invalid")

    monkeypatch.setattr(LLMEngine, "from_engine_args", classmethod(refuse))
