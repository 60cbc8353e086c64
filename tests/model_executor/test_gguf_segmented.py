"""SegmentedGGUFLinearMethod: a Linear whose parts are GGUF matrices of different types (Q4_K_M files: v in
Q6_K beside q and k in Q4_K), each held in its own type's blocks, against numpy on gguf-py's values.

Oracle: gguf-py's `dequantize` of each part, concatenated, and a float64 numpy matmul (1e-5 of
sum_k |x||w|, as the single-type op tests), through the layer (the `gguf_linear` op). The fused decoder
op's typed-linear path on segments is checked on whole models in test_gguf_models.py.
"""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.linear import Linear
from fastdeploy.model_executor.layers.quantization.gguf import GGUFConfig, SegmentedGGUFLinearMethod
from fastdeploy.model_executor.model_loader.quantized import Q4_0, Q4_K, Q5_K, Q6_K, Q8_0

from test_gguf_kquant_op import assert_close, quantized

pytestmark = pytest.mark.usefixtures("ops_enabled")

PARTS = {"q": (Q4_K, 40), "k": (Q8_0, 12), "v": (Q6_K, 20), "o": (Q4_0, 9)}  # shard -> (type, rows)
K = 512


def segmented_layer(rng, parts: dict, bias: bool = False, activation=None) -> tuple[Linear, np.ndarray]:
    """A Linear of `parts`' shards loaded with random blocks, and its dequantized weight [out, K]."""
    names = [f"{shard}.weight" for shard in parts]
    config = GGUFConfig({name: qtype for name, (qtype, _) in zip(names, parts.values())})
    layer = Linear(K, {shard: rows for shard, (_, rows) in parts.items()}, bias, config.linear_method(names),
                   activation=activation)
    assert isinstance(layer.method, SegmentedGGUFLinearMethod)
    dense = []
    for shard, (qtype, rows) in parts.items():
        w = quantized(rng, rows, K, qtype)
        layer.weight_loader(layer.weight, w, shard)
        dense.append(w.dequantize())
    return layer, np.concatenate(dense)


@pytest.mark.parametrize("m", [1, 3, 17, 70])
def test_segments_equal_the_dequantized_matrix(m):
    rng = np.random.default_rng(m)
    layer, w = segmented_layer(rng, PARTS)
    x = rng.standard_normal((m, K)).astype(np.float32)
    y = layer(paddle.to_tensor(x)).numpy()
    assert y.shape == (m, w.shape[0])
    assert_close(y.astype(np.float64), x, w)


def test_segmented_gate_up_with_swiglu_and_bias():
    rng = np.random.default_rng(1)
    layer, w = segmented_layer(rng, {0: (Q4_K, 32), 1: (Q5_K, 32)}, bias=True, activation="swiglu")
    bias = rng.standard_normal(64).astype(np.float32)
    layer.weight_loader(layer.bias, bias)
    x = rng.standard_normal((5, K)).astype(np.float32)
    h = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    gate, up = h[:, :32], h[:, 32:]
    ref = gate / (1 + np.exp(-gate)) * up
    np.testing.assert_allclose(layer(paddle.to_tensor(x)).numpy(), ref, rtol=1e-4, atol=1e-4)


def test_a_part_of_another_type_or_range_is_refused():
    rng = np.random.default_rng(2)
    layer, _ = segmented_layer(rng, PARTS)
    with pytest.raises(ValueError, match="header announced type"):
        layer.weight_loader(layer.weight, quantized(rng, 40, K, Q6_K), "q")
    with pytest.raises(ValueError, match="not one part"):
        layer.method.load(layer, quantized(rng, 10, K, Q4_K), 0, 10)
