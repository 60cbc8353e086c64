import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tiny_llama helpers


@pytest.fixture(params=["compiled_ops", "fallbacks"])
def attention_impl(request):
    """Run a test with the compiled decode op and again with the pure-Paddle fallback forced."""
    from fastdeploy.model_executor.ops import compiled_ops, fallbacks_forced

    with fallbacks_forced(request.param == "fallbacks"):
        if request.param == "compiled_ops":
            assert compiled_ops() is not None, "the compiled custom ops failed to build on this machine"
        yield request.param


@pytest.fixture
def ops_enabled():
    """Compiled ops available to the test even under FD_DISABLE_CUSTOM_OPS=1 (op tests compare both paths)."""
    from fastdeploy.model_executor.ops import fallbacks_forced

    with fallbacks_forced(False):
        yield
