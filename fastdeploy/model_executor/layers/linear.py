"""Linear layers and their linear methods: y = x @ W (+ b), W with in_features rows and out_features columns.

A `Linear` may pack several checkpoint tensors along its output features ("shards", as vLLM's
packed modules): the fused attention projection `qkv_proj` takes q_proj, k_proj and v_proj (shard
ids "q", "k", "v"), the fused MLP projection `gate_up_proj` takes gate_proj and up_proj (shard ids
0 and 1). `shard_ranges` holds each shard's output-feature range: the weight loader copies a
checkpoint tensor there (under tensor parallelism the tensor arrives already cut to the rank's part,
distributed/sharding.py, and the layer is built with the rank's sizes).

How W is stored and multiplied is the layer's *linear method*, chosen once when the layer is built
from the checkpoint's description (`quant_config`, see `select_linear_method`): dense float32
[in, out] for `paddle.matmul` (`UnquantizedLinearMethod`, here), or GGUF blocks for the compiled
`gguf_linear` op (layers/quantization/gguf.py). bf16 and wint8/wint4 methods go beside them.
"""
from typing import Optional, Sequence

import numpy as np
import paddle

from fastdeploy.model_executor.layers.parameters import check_shape, empty_parameter
from fastdeploy.model_executor.ops.activation import activation_kernel
from fastdeploy.model_executor.model_loader.quantized import QuantizedTensor


class LinearMethod:
    """How a Linear's weight is created, filled and multiplied (one instance per layer)."""

    def create_weights(self, layer: "Linear") -> paddle.Tensor:
        """The layer's empty weight parameter, its weight_loader being `layer.weight_loader`."""
        raise NotImplementedError

    def load(self, layer: "Linear", loaded, start: int, end: int) -> None:
        """Fill output features start:end from `loaded`, [end - start, in_features] (HF [out, in]
        orientation): a float32 numpy array or a QuantizedTensor; the shape is already checked."""
        raise NotImplementedError

    def apply(self, layer: "Linear", x: paddle.Tensor) -> paddle.Tensor:
        """x [n, in] float32 -> act(x @ W + b) [n, out] float32 (b: the layer's bias, when it has one; act:
        its activation, when it has one)."""
        raise NotImplementedError

    def operand(self, layer: "Linear", rows: int) -> tuple[paddle.Tensor, int]:
        """What `fd_decoder_layers` multiplies `rows` rows with: (dense [in, out] float32, 0) or
        (GGUF blocks, ggml type id)."""
        raise NotImplementedError


class UnquantizedLinearMethod(LinearMethod):
    """Dense float32 W [in, out] (Paddle's orientation) through `paddle.matmul`; quantized tensors are
    dequantized once at load."""

    def create_weights(self, layer: "Linear") -> paddle.Tensor:
        return empty_parameter([layer.in_features, layer.out_features], weight_loader=layer.weight_loader)

    def load(self, layer: "Linear", loaded, start: int, end: int) -> None:
        if isinstance(loaded, QuantizedTensor):
            loaded = loaded.dequantize()
        copy_transposed(np.from_dlpack(layer.weight)[:, start:end], loaded)

    def apply(self, layer: "Linear", x: paddle.Tensor) -> paddle.Tensor:
        return epilogue(layer, paddle.matmul(x, layer.weight))  # [n, in] @ [in, out]

    def operand(self, layer: "Linear", rows: int) -> tuple[paddle.Tensor, int]:
        return layer.weight, 0


# A Linear's `activation`: none, ops/activation.py quick_gelu, or silu_and_mul ("swiglu": an MLP's gate_up,
# shards gate and up of one size; its output is silu(gate) * up, half as wide as W)
ACTIVATIONS = (None, "quick_gelu", "swiglu")


def epilogue(layer: "Linear", y: paddle.Tensor) -> paddle.Tensor:
    """y [n, out], a product the caller owns, plus the layer's bias when it has one, then its activation
    (for a method whose kernel does neither). The bias in place: Paddle's `y + b` would write a new tensor,
    a slower second pass (benchmarks/README.md at commit 9c89004, "AMX prefill: 256-row blocks, panel
    groups; the bias where y is written")."""
    if layer.bias is not None:
        y = y.add_(layer.bias)
    return layer.activation_kernel(y) if layer.activation else y  # swiglu: [n, 2 inter] -> [n, inter]


class QuantConfig:
    """What a checkpoint says about how its tensors are stored (handed to the model at build)."""

    def linear_method(self, checkpoint_names: Sequence[str]) -> LinearMethod:
        """The method for a Linear whose shards are these checkpoint tensors (HF names)."""
        raise NotImplementedError


def select_linear_method(quant_config: Optional[QuantConfig], checkpoint_names: Sequence[str]) -> LinearMethod:
    """The one place a linear method is chosen: float checkpoints (no quant_config) are dense."""
    return quant_config.linear_method(checkpoint_names) if quant_config is not None else UnquantizedLinearMethod()


class Linear(paddle.nn.Layer):
    """y = act(x @ W (+ b)). shard_sizes: {shard id: output features}, in output order; one shard with
    id None for a plain (unpacked) layer. Parameters: `weight` (as the method stores it), `bias`
    [out_features] float32 when `bias`. activation: one of ACTIVATIONS, applied to the output (the packed
    method does it where its kernel writes y, in the same pass; "swiglu" takes two shards of one size and
    gives out_features / 2 columns); ValueError for another."""

    def __init__(self, in_features: int, shard_sizes: dict, bias: bool, method: LinearMethod,
                 activation: Optional[str] = None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.activation_kernel = activation_kernel(activation) if activation else None  # chosen at build
        self.in_features = in_features
        self.shard_ranges = {}
        start = 0
        for shard, size in shard_sizes.items():
            self.shard_ranges[shard] = (start, start + size)
            start += size
        self.out_features = start
        if activation == "swiglu" and (len(shard_sizes) != 2 or len(set(shard_sizes.values())) != 1):
            raise ValueError(f"activation 'swiglu' needs two shards (gate, up) of one size, got {shard_sizes}")
        self.method = method
        self.weight = method.create_weights(self)
        self.bias = empty_parameter([start], weight_loader=self.weight_loader) if bias else None

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.method.apply(self, x)  # x: [n, in] -> [n, out] ("swiglu": [n, out / 2])

    def weight_loader(self, param: paddle.Tensor, loaded, shard_id=None) -> None:
        """Copy checkpoint tensor `loaded` (HF orientation: weight [out, in], bias [out]) into the
        output features of `shard_id` (all of them for None). ValueError on a wrong shape."""
        start, end = self.shard_ranges[shard_id] if shard_id is not None else (0, self.out_features)
        if param is self.weight:
            check_shape(loaded, (end - start, self.in_features))
            self.method.load(self, loaded, start, end)
            return
        check_shape(loaded, (end - start,))
        np.from_dlpack(param)[start:end] = loaded


def copy_transposed(dst: np.ndarray, src: np.ndarray, rows: int = 256) -> None:
    """dst[...] = src.T, in blocks of `rows` source rows: 3x faster than one strided copy on CPU."""
    for start in range(0, src.shape[0], rows):
        dst[..., start : start + rows] = src[start : start + rows].T
