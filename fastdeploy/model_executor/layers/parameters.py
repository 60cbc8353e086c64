"""Parameters created empty and filled by loading, each with its `weight_loader`.

`empty_parameter` registers nothing and initialises nothing: the memory is `paddle.empty`'s
(pages are committed only as loading writes them), so building a model costs no random
initialisation. Loading (CausalLM.load_weights) calls `param.weight_loader(param, loaded, shard_id)`
for every checkpoint tensor; the loader copies it into the parameter's memory through a numpy view
(DLPack, no copy of the parameter) and raises ValueError("has shape [...], expected [...]") on a
wrong shape, which load_weights prefixes with the tensor's name. Under tensor parallelism `loaded` is
already the rank's slice (distributed/sharding.py).
"""
from typing import Callable, Optional

import numpy as np
import paddle
from paddle.base.framework import EagerParamBase

from fastdeploy.model_executor.model_loader.quantized import QuantizedTensor


def default_weight_loader(param: paddle.Tensor, loaded, shard_id: Optional[object] = None) -> None:
    """Copy `loaded` (numpy array, or QuantizedTensor dequantized here) whole into `param`; shard_id: None."""
    if isinstance(loaded, QuantizedTensor):
        loaded = loaded.dequantize()
    check_shape(loaded, param.shape)
    np.from_dlpack(param)[...] = loaded


def check_shape(loaded, expected) -> None:
    """ValueError when loaded.shape differs from `expected` (a list or tuple of ints)."""
    if tuple(loaded.shape) != tuple(expected):
        raise ValueError(f"has shape {list(loaded.shape)}, expected {list(expected)}")


def empty_parameter(shape: list[int], dtype: str = "float32",
                    weight_loader: Callable = default_weight_loader) -> paddle.Tensor:
    """An uninitialised parameter (no gradient) whose loading hook is `weight_loader`."""
    param = EagerParamBase.from_tensor(paddle.empty(shape, dtype=dtype))
    param.stop_gradient = True
    param.weight_loader = weight_loader
    return param
