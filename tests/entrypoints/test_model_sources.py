"""Where `model=` is found, and float16 checkpoints.

- ModelScope ids (`org/name`) under VLLM_USE_MODELSCOPE=True or FD_MODEL_SOURCE=MODELSCOPE are found in
  the local ModelScope cache (both layouts, both spellings of a dotted name) and in FastDeploy's
  download directory, without the modelscope package and without the network; a miss names every
  place looked; without the switch those places are not consulted.
- A float16 checkpoint (config.json naming float16, float16 safetensors) loads under dtype "auto" and
  "float16", held in float32: its prompt logprobs equal transformers' float32 run on the same float16
  values (log-softmax of its logits) within float32 rounding.
"""
import shutil
import sys

import numpy as np
import pytest
import torch

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.model_loader.model_path import resolve_model_path

from tiny_checkpoints import make_checkpoint

MODELSCOPE_SWITCHES = [{"VLLM_USE_MODELSCOPE": "True"}, {"VLLM_USE_MODELSCOPE": "true"}, {"FD_MODEL_SOURCE": "MODELSCOPE"}]
SOURCE_VARIABLES = ("VLLM_USE_MODELSCOPE", "FD_MODEL_SOURCE", "MODELSCOPE_CACHE", "FD_MODEL_CACHE", "HF_HUB_CACHE", "HF_HOME")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    make_checkpoint(path)
    return path


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty home directory and none of the model-source variables set (for path lookups only:
    an LLM built under it would rebuild the compiled ops, which are cached in the home directory)."""
    for name in SOURCE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def place(tiny, where):
    where.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tiny, where)
    return where


@pytest.mark.parametrize("switch", MODELSCOPE_SWITCHES, ids=lambda s: "=".join(*s.items()))
def test_modelscope_id_builds_offline(tiny, tmp_path, monkeypatch, switch):
    """HOME stays (the compiled ops are cached under it); MODELSCOPE_CACHE points at a fresh cache."""
    for name in SOURCE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**switch, "MODELSCOPE_CACHE": str(tmp_path / "hub")}.items():
        monkeypatch.setenv(name, value)
    where = place(tiny, tmp_path / "hub" / "models" / "org" / "tiny-llama")
    llm = LLM(model="org/tiny-llama", max_model_len=128, num_gpu_blocks_override=16)
    assert llm.llm_engine.config.model_path == str(where)
    assert "modelscope" not in sys.modules  # found without the modelscope package


@pytest.mark.parametrize("model_id,relative,env", [
    ("org/tiny", "home/.cache/modelscope/hub/models/org/tiny", {}),  # MODELSCOPE_CACHE's default
    ("org/tiny", "ms/models/org/tiny", {"MODELSCOPE_CACHE": "ms"}),
    ("org/tiny", "ms/org/tiny", {"MODELSCOPE_CACHE": "ms"}),  # older modelscope: no models/ level
    ("Qwen/Qwen2.5-0.5B", "home/.cache/modelscope/hub/models/Qwen/Qwen2___5-0___5B", {}),  # modelscope's spelling of "."
    ("Qwen/Qwen2.5-0.5B", "home/.cache/modelscope/hub/models/Qwen/Qwen2.5-0.5B", {}),
    ("org/tiny", "fd/org/tiny", {"FD_MODEL_CACHE": "fd"}),
    ("org/tiny", "home/org/tiny", {}),  # FastDeploy's default download directory: the home directory
    ("baidu/ERNIE-4.5-0.3B-Paddle", "home/.cache/modelscope/hub/models/PaddlePaddle/ERNIE-4.5-0.3B-Paddle", {}),
    ("baidu/ERNIE-4.5-0.3B-Paddle", "fd/PaddlePaddle/ERNIE-4.5-0.3B-Paddle", {"FD_MODEL_CACHE": "fd"}),
])
def test_modelscope_places(tiny, home, monkeypatch, model_id, relative, env):
    root = home.parent
    monkeypatch.setenv("FD_MODEL_SOURCE", "MODELSCOPE")
    for name, value in env.items():
        monkeypatch.setenv(name, str(root / value))
    where = place(tiny, root / relative)
    assert resolve_model_path(model_id) == str(where)


def test_modelscope_miss_names_every_place(tiny, home, monkeypatch):
    monkeypatch.setenv("VLLM_USE_MODELSCOPE", "True")
    monkeypatch.setenv("FD_MODEL_CACHE", str(home.parent / "fd"))
    (home / ".cache" / "modelscope" / "hub" / "models" / "org" / "tiny").mkdir(parents=True)  # no config.json
    with pytest.raises(FileNotFoundError) as error:
        resolve_model_path("org/tiny")
    message = str(error.value)
    hub = home / ".cache" / "modelscope" / "hub"
    for looked in (hub / "models" / "org" / "tiny", hub / "org" / "tiny", home.parent / "fd" / "org" / "tiny"):
        assert str(looked) in message
    assert "does not download" in message


def test_modelscope_places_unused_without_the_switch(tiny, home):
    place(tiny, home / ".cache" / "modelscope" / "hub" / "models" / "org" / "tiny")
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        resolve_model_path("org/tiny")


# ---- float16 checkpoints ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fp16(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama_fp16")
    return path, make_checkpoint(path, dtype="float16")


def test_float16_checkpoint_is_float16_on_disk(fp16):
    from safetensors import safe_open

    path, _ = fp16
    config = (path / "config.json").read_text()
    assert '"float16"' in config
    with safe_open(str(next(path.glob("*.safetensors"))), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}


@pytest.mark.parametrize("dtype", ["auto", "float16"])
def test_float16_checkpoint_held_in_float32_equals_transformers(fp16, dtype):
    path, hf = fp16
    llm = LLM(model=str(path), dtype=dtype, max_model_len=128, num_gpu_blocks_override=16, max_logprobs=-1)
    assert llm.llm_engine.config.cache_config.dtype == "float32"
    prompt = [5, 17, 230, 99, 4, 310, 77, 12, 401, 8]
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1, prompt_logprobs=-1), use_tqdm=False)[0]
    ours = np.array([[entry[t].logprob for t in range(len(entry))] for entry in out.prompt_logprobs[1:]])
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0, :-1].double()
    ref = torch.log_softmax(logits, dim=-1).numpy()
    assert np.abs(ours - ref).max() < 1e-4


def test_float16_checkpoint_in_bfloat16_on_request(fp16):
    from fastdeploy.model_executor.ops import compiled_op

    path, _ = fp16
    llm = LLM(model=str(path), dtype="bfloat16", max_model_len=128, num_gpu_blocks_override=16)
    packed = compiled_op("fd_packed_linear") is not None  # without the compiled ops every format is float32
    assert llm.llm_engine.config.cache_config.dtype == ("bfloat16" if packed else "float32")
    out = llm.generate({"prompt_token_ids": [5, 17, 230]}, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs.token_ids) == 4
