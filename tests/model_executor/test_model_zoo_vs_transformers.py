"""The model zoo (Qwen2, Qwen3, ERNIE-4.5 dense with and without biases) against transformers.

Oracle: transformers 5 (torch CPU, float32) on tiny random checkpoints it wrote itself. Logits at
every position of a ragged batch of prompts (one prefill step) must match transformers' logits of
each prompt alone within 1e-4 (max abs), and greedy generation through LLM.generate must give the
same 32 tokens as transformers' generate. ERNIE's interleaved RoPE is handled by permuting q/k rows
at load time: loading the same checkpoint as Llama (rotate-half RoPE, no permutation) must differ.
Then the loader's errors: an unsupported architecture, and a missing, misshapen or unknown tensor.
"""
import numpy as np
import pytest
import torch

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.ops import compiled_ops

from runner_access import model_runner
from test_llama_vs_transformers import PROMPT_LENGTHS, our_prefill_logits
from tiny_llama import VOCAB_SIZE
from tiny_models import TINY_MODELS, copy_checkpoint, edit_safetensors, make_tiny_model, read_config

LLM_KWARGS = dict(max_model_len=512, num_gpu_blocks_override=64)
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of n tokens that goes on past EOS, as ignore_eos does.

    Not `min_new_tokens=n`: that masks EOS out of the logits, so where EOS is the argmax (it is
    for one of the prompts here) transformers would pick the runner-up while ignore_eos keeps EOS.
    `eos_token_id=None` only turns off stopping; the logits are left alone.
    """
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=2)
    tokens = out[0, len(prompt):].tolist()
    assert len(tokens) == n
    return tokens


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(3, VOCAB_SIZE, size=n).tolist() for n in PROMPT_LENGTHS]


class Zoo:
    """One tiny checkpoint: its directory, transformers' model on it and our LLMs on it.

    Our model chooses its kernels when built, so there is one LLM per ops state (compiled ops or
    forced fallbacks), built on first use in that state. transformers' results are cached: they do
    not depend on which implementation we test.
    """

    def __init__(self, name, path, hf):
        self.name, self.path, self.hf = name, path, hf
        self._llms, self._ref_logits, self._ref_greedy = {}, {}, {}

    def llm(self) -> LLM:
        """Our LLM built with the compiled ops or the fallbacks, whichever the caller's context has."""
        compiled = compiled_ops() is not None
        if compiled not in self._llms:
            self._llms[compiled] = LLM(model=str(self.path), **LLM_KWARGS)
        return self._llms[compiled]

    def ref_logits(self, prompt: list[int]) -> np.ndarray:
        key = tuple(prompt)
        if key not in self._ref_logits:
            with torch.no_grad():
                self._ref_logits[key] = self.hf(torch.tensor([prompt])).logits[0].numpy()
        return self._ref_logits[key]

    def ref_greedy(self, prompt: list[int], n: int) -> list[int]:
        key = (tuple(prompt), n)
        if key not in self._ref_greedy:
            self._ref_greedy[key] = hf_greedy(self.hf, prompt, n)
        return self._ref_greedy[key]


@pytest.fixture(scope="module")
def zoo_of(tmp_path_factory):
    """zoo_of(name) -> Zoo, built once per module (one LLM per checkpoint) whatever the test order."""
    built = {}

    def get(name: str) -> Zoo:
        if name not in built:
            path = tmp_path_factory.mktemp(name)
            hf = make_tiny_model(path, name)
            built[name] = Zoo(name, path, hf)
        return built[name]

    return get


ALL = pytest.mark.parametrize("name", list(TINY_MODELS))
ERNIE = pytest.mark.parametrize("name", [n for n in TINY_MODELS if n.startswith("ernie")])


@ALL
def test_ragged_prefill_logits_match_transformers(zoo_of, name, prompts, attention_impl):
    zoo = zoo_of(name)
    model = model_runner(zoo.llm()).model
    assert type(model).__name__ == TINY_MODELS[name][0]
    assert model.config.head_dim == zoo.hf.model.layers[0].self_attn.head_dim  # qwen3: 32, not 64 / 4
    ours = our_prefill_logits(zoo.llm(), prompts)
    for prompt, logits in zip(prompts, ours):
        ref = zoo.ref_logits(prompt)
        assert logits.shape == ref.shape == (len(prompt), VOCAB_SIZE)
        diff = np.abs(logits - ref).max()
        assert diff <= 1e-4, f"{zoo.name}: prompt of length {len(prompt)}: max abs diff {diff}"


@ALL
def test_greedy_generation_matches_transformers(zoo_of, name, prompts, attention_impl):
    zoo = zoo_of(name)
    outputs = zoo.llm().generate(prompts, GREEDY, use_tqdm=False)
    assert len(outputs) == len(prompts)
    for prompt, output in zip(prompts, outputs):
        assert output.outputs.token_ids == zoo.ref_greedy(prompt, 32), f"{zoo.name}: prompt length {len(prompt)}"
    assert len(set(t for o in outputs for t in o.outputs.token_ids)) > 4  # continuations vary


@ERNIE
def test_ernie_checkpoint_needs_the_interleaved_rope_permutation(zoo_of, name, prompts, tmp_path):
    """The same ERNIE weights built as Llama (rotate-half RoPE on unpermuted q/k rows) give other logits.

    At position 0 RoPE is the identity and a single key makes q/k irrelevant, so the first logits of
    every prompt still agree: the difference is the pairing of RoPE dims and nothing else.
    """
    zoo = zoo_of(name)
    use_bias = read_config(zoo.path)["use_bias"]

    def as_llama(cfg):
        cfg["architectures"] = ["LlamaForCausalLM"]
        cfg["attention_bias"] = use_bias  # Llama's flags for the same biases, so every tensor loads
        cfg["mlp_bias"] = use_bias

    llama = LLM(model=str(copy_checkpoint(zoo.path, tmp_path / "as_llama", as_llama)), **LLM_KWARGS)
    assert type(model_runner(llama).model).__name__ == "LlamaForCausalLM"
    as_llama_logits = our_prefill_logits(llama, prompts)
    ours = our_prefill_logits(zoo.llm(), prompts)
    for prompt, wrong, right in zip(prompts, as_llama_logits, ours):
        ref = zoo.ref_logits(prompt)
        assert np.abs(right - ref).max() <= 1e-4
        assert np.abs(wrong[0] - ref[0]).max() <= 1e-4
        if len(prompt) > 1:
            assert np.abs(wrong[1:] - ref[1:]).max() > 1e-2, f"prompt length {len(prompt)}"


# ---- loading errors ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_base")
    make_tiny_model(path, "qwen2", seed=1)
    return path


def test_unsupported_architecture_lists_the_supported_ones(qwen2_dir, tmp_path):
    path = copy_checkpoint(qwen2_dir, tmp_path / "gpt2", lambda cfg: cfg.update(architectures=["GPT2LMHeadModel"]))
    with pytest.raises(ValueError) as info:
        LLM(model=str(path), **LLM_KWARGS)
    message = str(info.value)
    assert "GPT2LMHeadModel" in message
    for supported in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Ernie4_5ForCausalLM"):
        assert supported in message


def _drop(name):
    return lambda tensors: tensors.pop(name)


def _reshape(name, shape):
    def edit(tensors):
        tensors[name] = np.zeros(shape, dtype=np.float32)
    return edit


def _add(name, shape):
    def edit(tensors):
        assert name not in tensors
        tensors[name] = np.zeros(shape, dtype=np.float32)
    return edit


@pytest.mark.parametrize("tensor,edit", [
    ("model.layers.1.mlp.down_proj.weight", _drop("model.layers.1.mlp.down_proj.weight")),
    ("model.layers.0.self_attn.q_proj.bias", _drop("model.layers.0.self_attn.q_proj.bias")),  # Qwen2 needs it
    ("lm_head.weight", _drop("lm_head.weight")),  # untied: no fallback to the embedding
    ("model.layers.0.self_attn.k_proj.weight", _reshape("model.layers.0.self_attn.k_proj.weight", (64, 64))),
    ("model.layers.1.self_attn.v_proj.bias", _reshape("model.layers.1.self_attn.v_proj.bias", (64,))),
    ("model.layers.0.mlp.up_proj.weight", _reshape("model.layers.0.mlp.up_proj.weight", (64, 128))),  # transposed
    ("model.layers.0.foo.weight", _add("model.layers.0.foo.weight", (64,))),
    ("model.layers.0.self_attn.o_proj.bias", _add("model.layers.0.self_attn.o_proj.bias", (64,))),  # not in Qwen2
    ("model.layers.2.mlp.down_proj.weight", _add("model.layers.2.mlp.down_proj.weight", (64, 128))),  # 3rd layer
], ids=["missing", "missing-bias", "missing-lm_head", "wrong-shape", "wrong-shape-bias", "transposed",
        "unknown", "unknown-bias", "extra-layer"])
def test_bad_checkpoint_tensor_is_named_in_the_error(qwen2_dir, tmp_path, tensor, edit):
    path = copy_checkpoint(qwen2_dir, tmp_path / "bad")
    edit_safetensors(path, edit)
    with pytest.raises(ValueError, match=tensor.replace(".", r"\.")):
        LLM(model=str(path), **LLM_KWARGS)
