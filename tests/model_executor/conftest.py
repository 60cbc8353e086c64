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
