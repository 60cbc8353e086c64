"""The vision encoder's linear methods: RowBlockedLinearMethod (AMD CPUs) equals float64 numpy on rows
that fill several 512-row blocks and a tail, and linear_method() picks it by CPU vendor."""
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.linear import UnquantizedLinearMethod
from fastdeploy.model_executor.models.ernie4_5_vl import vision
from fastdeploy.model_executor.models.ernie4_5_vl.vision import RowBlockedLinearMethod, encoder_linear


@pytest.mark.parametrize("rows", [1, 512, 1300])
def test_row_blocks_match_float64(monkeypatch, rows):
    monkeypatch.setattr(vision, "is_amd_cpu", lambda: True)
    layer = encoder_linear(24, 40, None, "x")
    assert isinstance(layer.method, RowBlockedLinearMethod)
    rng = np.random.default_rng(rows)
    weight, bias = rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    layer.weight_loader(layer.weight, weight)  # HF orientation [out, in]
    layer.weight_loader(layer.bias, bias)
    x = rng.standard_normal((rows, 24)).astype(np.float32)
    expected = x.astype(np.float64) @ weight.T.astype(np.float64) + bias
    out = layer(paddle.to_tensor(x)).numpy()
    assert out.shape == (rows, 40) and np.abs(out - expected).max() < 1e-5


@pytest.mark.parametrize("amd, method", [(True, RowBlockedLinearMethod), (False, UnquantizedLinearMethod)])
def test_method_follows_vendor(monkeypatch, amd, method):
    monkeypatch.setattr(vision, "is_amd_cpu", lambda: amd)
    assert type(vision.linear_method()) is method
