"""Sizing the KV block pool: settings that leave no room for one max_model_len sequence are
rejected with their numbers, before any model is built; the pool size follows the memory
arithmetic. (Engine internals: the memory probe, cache_manager/kv_cache_sizing.py and the model
config's byte counts have no public API.)"""
import pytest

from fastdeploy import LLM
from fastdeploy.cache_manager import kv_cache_sizing
from fastdeploy.engine.args_utils import EngineArgs

GiB = 1 << 30
SMALL_BLOCK, SMALL_LEN, SMALL_BLOCKS = 8, 160, 21  # 20 usable blocks = one max_model_len sequence


@pytest.fixture
def no_model_build(monkeypatch):
    """Building the model fails loudly: settings errors must come before it."""

    class Refuse:
        def __init__(self, *args, **kwargs):
            raise AssertionError("the model was being built although the settings are invalid")

    import fastdeploy.model_executor.models as models

    monkeypatch.setattr(models, "get_model_class", lambda architecture, pooling_task=None: Refuse)


def test_pool_smaller_than_one_sequence_is_rejected_with_its_numbers(no_model_build):
    blocks = SMALL_BLOCKS - 1  # one short: the null block leaves SMALL_BLOCKS - 2 usable
    with pytest.raises(ValueError) as e:
        LLM(max_model_len=SMALL_LEN, block_size=SMALL_BLOCK, num_gpu_blocks_override=blocks)
    message = str(e.value)
    per_seq = SMALL_LEN // SMALL_BLOCK
    for part in (f"num_gpu_blocks_override={blocks}", f"{blocks - 1} usable blocks", f"max_model_len={SMALL_LEN}",
                 f"needs {per_seq} blocks", f"of {SMALL_BLOCK} tokens", f"at least {per_seq + 1}"):
        assert part in message, f"{part!r} not in: {message}"


def test_memory_too_small_for_one_sequence_is_rejected_with_gib_numbers(smollm_llm, smollm_path, no_model_build,
                                                                        monkeypatch):
    from fastdeploy.model_executor.layers.quantization.weight_format import gguf_held_bytes
    from fastdeploy.model_executor.model_loader.gguf_file import GGUFFile

    mc = smollm_llm.llm_engine.config.model_config
    weights = gguf_held_bytes(GGUFFile(smollm_path))  # the default model is a GGUF file, held in its blocks
    tiny = 64 << 20
    monkeypatch.setattr(kv_cache_sizing, "available_memory_bytes", lambda: tiny)
    with pytest.raises(ValueError) as e:
        LLM(max_model_len=8192, block_size=64)
    message = str(e.value)
    needed = (8192 // 64 + 1) * 64 * mc.kv_bytes_per_token()
    for part in (f"needs {needed / GiB:.2f} GiB", "0.00 GiB is available", f"{tiny / GiB:.2f} GiB free memory",
                 f"{weights / GiB:.2f} GiB weights", "max_model_len", "gpu_memory_utilization"):
        assert part in message, f"{part!r} not in: {message}"


def test_pool_sizing_from_memory_arithmetic(monkeypatch, smollm_llm):
    """num_kv_blocks with a patched memory size: num_blocks = min(budget // block_bytes, useful)."""
    mc = smollm_llm.llm_engine.config.model_config
    weights = mc.weight_bytes()
    block_size, max_len, seqs, util = 16, 256, 4, 0.5
    block_bytes = mc.kv_bytes_per_token() * block_size
    per_seq = max_len // block_size  # 16
    useful = seqs * per_seq + 1  # 65

    def blocks_with_budget(budget_bytes, dtype="float32"):
        monkeypatch.setattr(kv_cache_sizing, "available_memory_bytes", lambda: int((budget_bytes + weights) / util) + 1)
        args = EngineArgs(max_model_len=max_len, block_size=block_size, max_num_seqs=seqs, gpu_memory_utilization=util)
        return kv_cache_sizing.num_kv_blocks(args.cache_config(), mc, max_len, seqs, weights, dtype)

    assert blocks_with_budget((per_seq + 1) * block_bytes) == per_seq + 1  # just one sequence + the null block
    assert blocks_with_budget(40 * block_bytes + block_bytes // 2) == 40
    assert blocks_with_budget(20 * block_bytes + block_bytes // 2, "bfloat16") == 41  # 2 bytes per element
    assert blocks_with_budget(1000 * block_bytes) == useful  # no more than max_num_seqs sequences use
    with pytest.raises(ValueError, match="max_model_len=256 sequence needs"):
        blocks_with_budget((per_seq + 1) * block_bytes - block_bytes // 2)
