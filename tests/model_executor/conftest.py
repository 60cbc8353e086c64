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


def model_runner(llm):
    """The model runner of an LLM (owner of `.model` and `.kv_caches`): the one place tests reach it."""
    return llm.llm_engine.runner


def forward_logits(llm, prompts: list[list[int]], block_tables: list[list[int]], history: int):
    """Logits [total tokens, vocab] of every token of `prompts` in one ragged step, each prompt after
    its own `history` tokens already in its cache blocks `block_tables` (the runner's model and caches)."""
    import numpy as np
    import paddle

    from fastdeploy.model_executor.forward_meta import ForwardMeta

    runner = model_runner(llm)
    meta = ForwardMeta.build(seq_lens_this_time=[len(p) for p in prompts], seq_lens_decoder=[history] * len(prompts),
                             block_tables=block_tables, block_size=runner.block_size, caches=runner.kv_caches)
    ids = paddle.to_tensor(np.asarray([t for p in prompts for t in p], dtype=np.int64))
    positions = paddle.to_tensor(np.concatenate([np.arange(history, history + len(p)) for p in prompts]))
    with paddle.no_grad():
        hidden = runner.model(ids, positions, meta)
        return runner.model.compute_logits(hidden).numpy()
