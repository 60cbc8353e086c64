"""Bad settings and sampling values: `SamplingParams(...)` and `LLM(...)` raise a clear error naming
the field, the value and what is allowed, before any model is loaded; model paths that are not a
model fail fast without downloading anything."""
from __future__ import annotations

import re
import signal

import pytest

from fastdeploy import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("no_hang")


# ---- sampling values (validated when SamplingParams is built) ----------------------------------
@pytest.mark.parametrize(
    "kwargs, error, field, shown",
    [
        ({"temperature": -1}, ValueError, "temperature", "-1"),
        ({"n": 1025, "temperature": 1}, ValueError, "n", "1025"),
        ({"n": 10**30, "temperature": 1}, ValueError, "n", str(10**30)),
        ({"temperature": "hot"}, TypeError, "temperature", "'hot'"),
        ({"temperature": True}, TypeError, "temperature", "True"),
        ({"top_p": 0}, ValueError, "top_p", "got 0"),
        ({"top_p": 1.5}, ValueError, "top_p", "1.5"),
        ({"top_k": -2}, ValueError, "top_k", "-2"),
        ({"top_k": 1.5}, TypeError, "top_k", "1.5"),
        ({"max_tokens": 0}, ValueError, "max_tokens", "got 0"),
        ({"max_tokens": 2.0}, TypeError, "max_tokens", "2.0"),
        ({"min_tokens": 5, "max_tokens": 3}, ValueError, "min_tokens", "5"),
        ({"min_tokens": -1}, ValueError, "min_tokens", "-1"),
        ({"seed": -1}, ValueError, "seed", "-1"),
        ({"seed": 2**63}, ValueError, "seed", str(2**63)),
        ({"stop": [1]}, TypeError, "stop", "[1]"),
        ({"stop": ""}, ValueError, "stop", "''"),
        ({"stop_token_ids": [-1]}, TypeError, "stop_token_ids", "[-1]"),
        ({"n": 0}, ValueError, "n", "got 0"),
        ({"n": "2"}, TypeError, "n", "'2'"),
        ({"n": 2, "temperature": 0}, ValueError, "n", "n=2"),
        ({"temperature": float("nan")}, ValueError, "temperature", "nan"),
        ({"temperature": float("inf")}, ValueError, "temperature", "inf"),
        ({"presence_penalty": 2.5}, ValueError, "presence_penalty", "2.5"),
        ({"presence_penalty": -3}, ValueError, "presence_penalty", "-3"),
        ({"frequency_penalty": 3}, ValueError, "frequency_penalty", "got 3"),
        ({"frequency_penalty": "lots"}, TypeError, "frequency_penalty", "'lots'"),
        ({"repetition_penalty": 0}, ValueError, "repetition_penalty", "got 0"),
        ({"repetition_penalty": -1.2}, ValueError, "repetition_penalty", "-1.2"),
        ({"bad_words": "word"}, TypeError, "bad_words", "'word'"),
        ({"bad_words": [7]}, TypeError, "bad_words", "[7]"),
        ({"bad_words": ["ok", " "]}, ValueError, "bad_words", "' '"),
        ({"bad_words_token_ids": [-5]}, TypeError, "bad_words_token_ids", "[-5]"),
        ({"logprobs": -2}, ValueError, "logprobs", "-2"),
        ({"logprobs": 1.5}, TypeError, "logprobs", "1.5"),
        ({"prompt_logprobs": -3}, ValueError, "prompt_logprobs", "-3"),
        ({"ignore_eos": "yes"}, TypeError, "ignore_eos", "'yes'"),
        ({"include_stop_str_in_output": 1}, TypeError, "include_stop_str_in_output", "1"),
        ({"min_p": 2}, ValueError, "min_p", "2"),
        ({"min_p": -0.1}, ValueError, "min_p", "-0.1"),
    ],
    ids=lambda v: repr(v)[:30] if not isinstance(v, type) else v.__name__,
)
def test_invalid_sampling_values_name_the_field_and_value(kwargs, error, field, shown):
    with pytest.raises(error) as info:
        SamplingParams(**kwargs)
    message = str(info.value)
    assert message.startswith(f"{field} must "), message
    assert shown in message, message


@pytest.mark.parametrize(
    "kwargs, field",
    [({"max_logprobs": -2}, "max_logprobs"), ({"logprobs_mode": "raw_logits"}, "logprobs_mode"),
     ({"enable_logprob": "yes"}, "enable_logprob")],
)
def test_logprob_settings_are_checked_before_loading(no_loading, kwargs, field):
    with pytest.raises((ValueError, TypeError), match=rf"^{field} must"):
        LLM(**kwargs)


def test_min_tokens_message_names_max_tokens():
    with pytest.raises(ValueError, match=r"min_tokens must be <= max_tokens=3, got 5"):
        SamplingParams(min_tokens=5, max_tokens=3)


# ---- LLM(...) settings and model paths ---------------------------------------------------------
def test_unknown_keyword_raises_before_loading(no_loading):
    with pytest.raises(TypeError, match=r"unknown keyword argument\(s\) \['max_num_sequences'\]"):
        LLM(max_num_sequences=4)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_model_len": "256"}, "max_model_len"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"master_port": 70000}, "master_port"),
        ({"master_addr": ""}, "master_addr"),
        ({"nnodes": 0}, "nnodes"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"block_size": 0}, "block_size"),
        ({"num_gpu_blocks_override": 1}, "num_gpu_blocks_override"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"kv_cache_ratio": 2}, "kv_cache_ratio"),
        ({"seed": -1}, "seed"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_invalid_settings_raise_before_loading(no_loading, kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        LLM(**kwargs)


@pytest.mark.parametrize("kwargs", [{"tensor_parallel_size": 3, "nnodes": 2, "master_port": 29500},
                                    {"tensor_parallel_size": 2, "nnodes": 2},
                                    {"tensor_parallel_size": 3, "pipeline_parallel_size": 3, "nnodes": 2,
                                     "master_port": 29500}])
def test_nodes_must_divide_the_ranks_and_know_the_master_port(no_loading, kwargs):
    with pytest.raises(ValueError, match=r"^nnodes must divide the ranks \(pipeline_parallel_size x tensor_parallel_size "
                                         r"= \d\) and, above 1, come with a master_port"):
        LLM(**kwargs)


def test_max_model_len_above_the_models_context_is_rejected():
    with pytest.raises(ValueError, match=r"max_model_len=100000 exceeds the model's max_position_embeddings=8192"):
        LLM(max_model_len=100_000)


def test_budget_below_max_model_len_without_chunked_prefill_is_rejected():
    with pytest.raises(ValueError, match=r"max_num_batched_tokens=64 is below max_model_len=256"):
        LLM(max_model_len=256, max_num_batched_tokens=64)


def test_model_path_that_does_not_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=r"is not a local directory or file"):
        LLM(model=str(missing))


def test_directory_without_config_json(tmp_path):
    (tmp_path / "README.md").write_text("not a model")
    with pytest.raises(FileNotFoundError, match=r"has no config.json"):
        LLM(model=str(tmp_path))


def test_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match=r"is not a .gguf file"):
        LLM(model=str(path))


def test_gguf_file_that_is_not_gguf_inside(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + b"\0" * 60)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is not a GGUF file: it starts with b'PK"):
        LLM(model=str(path))
    path.write_bytes(b"GGUF\x03\0\0\0" + b"\0" * 5)
    with pytest.raises(ValueError, match=rf"GGUF file {re.escape(str(path))} is truncated: the tensor count"):
        LLM(model=str(path))


def test_name_not_in_the_hf_cache_is_not_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError) as info:
        LLM(model="no-such-org/no-such-model-xyz")
    message = str(info.value)
    assert "does not download" in message
    assert "no-such-org/no-such-model-xyz" in message and str(tmp_path) in message


def test_model_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"model must be a path or a model name \(str\), got int"):
        LLM(model=5)


def test_pool_too_small_for_one_sequence_does_not_hang():
    """2 usable blocks of 16 tokens cannot hold one max_model_len=256 sequence: either LLM() says
    so, or generate() must end (an error or an output), not spin forever."""
    try:
        small = LLM(max_model_len=256, block_size=16, num_gpu_blocks_override=3)
    except ValueError as e:
        assert "num_gpu_blocks_override" in str(e) or "max_model_len" in str(e)
        return
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    signal.alarm(30)  # 100 tokens of a 135M model take a few seconds
    try:
        out = small.generate([[100] * 10], params, use_tqdm=False)
    except ValueError as e:
        assert "block" in str(e) or "max_model_len" in str(e)
    else:
        assert len(out) == 1 and out[0].outputs.finish_reason is not None
    assert not small.llm_engine.has_unfinished_requests()
