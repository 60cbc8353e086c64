"""Models as paddle.nn.Layer trees: parameter names, state_dict, inputs_embeds, weight loaders, kernel choices.

Oracles: the checkpoint's own tensor names (mapped through the documented packing), the model itself
run on input ids (for inputs_embeds and for a fresh model given its state_dict: bit-identical
logits), transformers' logits on the same weights (for a model built with fallbacks forced), and
the shard layout each packed parameter must receive (q/k/v rows, gate/up rows).
"""
import numpy as np
import paddle
import pytest
import torch

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.append_attention import AppendAttentionBackend
from fastdeploy.model_executor.layers.attention import PaddleAttentionBackend, allocate_kv_cache
from fastdeploy.model_executor.layers.decoder_layer import DecoderLayer
from fastdeploy.model_executor.layers.fused_decoder_layers import FusedDecoderLayers
from fastdeploy.model_executor.layers.linear import Linear, UnquantizedLinearMethod
from fastdeploy.model_executor.model_loader import open_model
from fastdeploy.model_executor.model_loader.packed_modules import parameter_of
from fastdeploy.model_executor.models import get_model_class
from fastdeploy.model_executor.ops import fallbacks_forced, loader

from tiny_models import make_tiny_model

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    """(checkpoint dir, transformers model): Qwen2 has q/k/v biases and an untied lm_head."""
    path = tmp_path_factory.mktemp("qwen2_tree")
    return path, make_tiny_model(path, "qwen2", seed=3)


def build(path, load: bool = True):
    """Our model on the checkpoint at `path`, built in the caller's ops state (loaded unless load=False)."""
    _, source = open_model(path)
    config = ModelConfig.from_hf_config(source.hf_config)
    model = get_model_class(config.architecture)(config, BLOCK_SIZE, 256, source.quant_config)
    if load:
        model.load_weights(source.weights())
    return model


def prefill_logits(model, ids: list[int], embeds: bool = False) -> np.ndarray:
    """Logits [len(ids), vocab] of one prompt in a fresh cache, from token ids or from embed_input_ids."""
    config = model.config
    caches = [allocate_kv_cache(8, config.num_key_value_heads, BLOCK_SIZE, config.head_dim)
              for _ in range(config.num_hidden_layers)]
    blocks = list(range(1, 1 + -(-len(ids) // BLOCK_SIZE)))
    meta = ForwardMeta.build([len(ids)], [0], [blocks], BLOCK_SIZE, caches)
    input_ids = paddle.to_tensor(np.asarray(ids, dtype=np.int64))
    positions = paddle.arange(len(ids), dtype="int64")
    with paddle.no_grad():
        if embeds:
            hidden = model(None, positions, meta, inputs_embeds=model.embed_input_ids(input_ids))
        else:
            hidden = model(input_ids, positions, meta)
        assert hidden.shape == [len(ids), config.hidden_size]
        return model.compute_logits(hidden).numpy()


PROMPT = [5, 17, 300, 42, 7, 99, 250, 3, 11, 480, 64, 128, 9, 33, 71, 200, 18, 6, 401]  # crosses a block


def test_parameter_names_are_the_mapped_checkpoint_names(qwen2):
    path, _ = qwen2
    _, source = open_model(path)
    mapped = {parameter_of(name)[0] for name, _ in source.weights()}
    model = build(path, load=False)
    assert set(dict(model.named_parameters())) == mapped
    assert "model.layers.0.self_attn.qkv_proj.bias" in mapped and "model.layers.1.mlp.gate_up_proj.weight" in mapped
    assert set(model.state_dict()) == mapped  # no buffers beside the parameters


def test_a_fresh_model_given_the_state_dict_gives_identical_logits(qwen2):
    path, _ = qwen2
    loaded = build(path)
    fresh = build(path, load=False)
    fresh.set_state_dict(loaded.state_dict())
    np.testing.assert_array_equal(prefill_logits(fresh, PROMPT), prefill_logits(loaded, PROMPT))


def test_inputs_embeds_give_the_hidden_states_of_input_ids(qwen2):
    model = build(qwen2[0])
    np.testing.assert_array_equal(prefill_logits(model, PROMPT, embeds=True), prefill_logits(model, PROMPT))


def test_weight_loaders_receive_the_shards_of_packed_parameters(qwen2, monkeypatch):
    path, _ = qwen2
    model = build(path, load=False)
    calls = []
    for name, param in model.named_parameters():
        def record(p, loaded, shard_id=None, name=name, inner=param.weight_loader):
            calls.append((name, shard_id, tuple(loaded.shape)))
            inner(p, loaded, shard_id)
        param.weight_loader = record
    _, source = open_model(path)
    model.load_weights(source.weights())
    got = {(name, shard): shape for name, shard, shape in calls if ".0." in name}
    qkv, gate_up = "model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj"
    # 4 heads and 2 KV heads of 16 dims over hidden 64; intermediate 128
    assert {k: v for k, v in got.items() if k[0].startswith((qkv, gate_up))} == {
        (f"{qkv}.weight", "q"): (64, 64), (f"{qkv}.weight", "k"): (32, 64), (f"{qkv}.weight", "v"): (32, 64),
        (f"{qkv}.bias", "q"): (64,), (f"{qkv}.bias", "k"): (32,), (f"{qkv}.bias", "v"): (32,),
        (f"{gate_up}.weight", 0): (128, 64), (f"{gate_up}.weight", 1): (128, 64),
    }
    layer = model.model.layers[0]
    assert layer.self_attn.qkv_proj.shard_ranges == {"q": (0, 64), "k": (64, 96), "v": (96, 128)}
    assert layer.mlp.gate_up_proj.shard_ranges == {0: (0, 128), 1: (128, 256)}
    assert ("model.layers.0.self_attn.o_proj.weight", None, (64, 64)) in calls


def record_compiled_ops(monkeypatch) -> list[str]:
    """Route every compiled op handed out from now on through a recorder; returns the list of the
    names of the ops called (compiled ops allowed, whatever FD_DISABLE_CUSTOM_OPS says)."""
    real, calls = loader._load(), []
    assert real is not None, "the compiled custom ops failed to build on this machine"

    class Recording:
        def __getattr__(self, name):
            op = getattr(real, name)

            def recorded(*args):
                calls.append(name)
                return op(*args)
            return recorded

    monkeypatch.setattr(loader, "_load", lambda: Recording())
    monkeypatch.setattr(loader, "_forced", [False])
    return calls


def assert_fallback_choices(model) -> None:
    assert isinstance(model.model.attn_backend, PaddleAttentionBackend)
    assert all(isinstance(run, DecoderLayer) for run in model.model.runs)
    assert all(isinstance(layer.method, UnquantizedLinearMethod) for layer in model.sublayers()
               if isinstance(layer, Linear))


def test_a_model_built_with_fallbacks_forced_runs_only_fallbacks(qwen2, monkeypatch):
    path, hf = qwen2
    calls = record_compiled_ops(monkeypatch)
    with fallbacks_forced():
        model = build(path)
    assert_fallback_choices(model)
    ours = prefill_logits(model, PROMPT)  # outside the block: only the build's choices count
    assert calls == []
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0].numpy()
    assert np.abs(ours - ref).max() <= 1e-4
    prefill_logits(build(path), PROMPT)  # the recorder sees the ops of a model built with them
    assert "fd_decoder_layers" in calls and "fd_fused_add_rms_norm" in calls  # Qwen2's layers run fused


def test_the_default_gguf_model_built_with_fallbacks_forced_runs_only_fallbacks(smollm_path, monkeypatch):
    calls = record_compiled_ops(monkeypatch)
    with fallbacks_forced():
        model = build(smollm_path)
    assert_fallback_choices(model)
    assert np.isfinite(prefill_logits(model, PROMPT)).all()
    assert calls == []


def test_kernel_choices_made_with_compiled_ops_hold_under_fallbacks_forced(qwen2, ops_enabled):
    """The choice is the build's: entering fallbacks_forced afterwards changes nothing a model runs."""
    path, _ = qwen2
    model = build(path)
    assert isinstance(model.model.attn_backend, AppendAttentionBackend)
    assert [type(run) for run in model.model.runs] == [FusedDecoderLayers]  # biases and all, one fused run
    expected = prefill_logits(model, PROMPT)
    with fallbacks_forced():
        assert isinstance(model.model.attn_backend, AppendAttentionBackend)
        np.testing.assert_array_equal(prefill_logits(model, PROMPT), expected)
