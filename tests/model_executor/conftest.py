import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tiny_llama helpers


@pytest.fixture(params=["compiled_ops", "fallbacks"])
def attention_impl(request, monkeypatch):
    """Run a test with the compiled decode op and again with the pure-Paddle fallback forced."""
    import fastdeploy.model_executor.layers.attention as attention
    from fastdeploy.model_executor.ops.cpu import cpu_ops

    if request.param == "fallbacks":
        monkeypatch.setattr(attention, "cpu_ops", lambda: None)
    else:
        assert cpu_ops() is not None, "the compiled CPU ops failed to build on this machine"
    return request.param
