"""Parameters created empty and filled by loading, each with its `weight_loader`.

`empty_parameter` registers nothing and initialises nothing: the memory is `paddle.empty`'s
(pages are committed only as loading writes them), so building a model costs no random
initialisation. Loading (CausalLM.load_weights) calls `param.weight_loader(param, loaded, shard_id)`
for every checkpoint tensor; the loader copies it into the parameter's memory through a numpy view
(DLPack, no copy of the parameter) and raises ValueError("has shape [...], expected [...]") on a
wrong shape, which load_weights prefixes with the tensor's name. Under tensor parallelism `loaded` is
already the rank's slice (distributed/sharding.py).

Parameter objects are reused across models (`release_parameters`, called when an executor shuts
down, frees their memory and keeps the empty objects for the next model with the same shapes):
Paddle 3.3's parameter constructor leaves a Python list behind per call, which pinned ~16 MiB of
the Python heap per `LLM(...)` / `del llm` (model_executor/host_arrays.py has the details).
"""
import threading
from collections import defaultdict
from typing import Callable, Iterable, Optional

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
    """An uninitialised parameter (no gradient) whose loading hook is `weight_loader`: a released
    parameter object of the same shape and dtype with new memory when there is one, else a new one."""
    memory = paddle.empty(shape, dtype=dtype)
    with _released_lock:
        shelf = _released[(tuple(shape), str(memory.dtype))]
        param = shelf.pop() if shelf else None
    if param is None:
        param = EagerParamBase.from_tensor(memory)
    else:
        memory._share_buffer_to(param)
    param.stop_gradient = True
    param.weight_loader = weight_loader
    return param


_released: dict = defaultdict(list)  # (shape, dtype) -> parameter objects without memory
_released_lock = threading.Lock()


def release_parameters(params: Iterable[paddle.Tensor]) -> None:
    """Free the parameters' memory, drop their loading hooks and keep the objects for reuse by
    `empty_parameter`. The parameters must not be used again by their model."""
    for param in params:
        param.weight_loader = None  # a bound method of its layer: layer -> param -> hook -> layer
        key = (tuple(param.shape), str(param.dtype))
        param._clear_data()
        with _released_lock:
            _released[key].append(param)
