"""bf16 and weight-only int8/int4 weights, packed once at load for the compiled `fd_packed_linear` op.

`PackedConfig` is the QuantConfig of a float checkpoint run with `dtype="bfloat16"` or
`quantization="wint8" | "wint4"` (FastDeploy's names). Every Linear gets a `PackedLinearMethod` of
that kind when the compiled op is available and its in_features suit the kind (even; a multiple of 64
for wint4), else the dense float32 method.

The weight parameter is one uint8 tensor in custom_ops/cpu_ops/packed_linear.h's layout: panels of
64 output features, input features in pairs (AVX512-BF16's operand order), then the float32 scales.
What is stored, for W [out, in] (HF orientation):

  * bf16: round_to_nearest_even(W) to bfloat16 (2 bytes per weight; exact for a bf16 checkpoint);
  * wint8: per output feature s = max|W[n]| / 127, q = round(W / s) in [-127, 127] (1 byte + 4 / in);
  * wint4 (lm_head and a tied embedding: wint8, see lm_head_kind): per output feature and group of
    32 inputs, asymmetric: m = min W[n, g], d = (max - m) / 15,
    q = round((W - m) / d) in [0, 15] (half a byte + 8 / 32 bytes: llama.cpp Q4_1's size).

The op rounds x to bf16 and multiplies it with bf16(W), q (wint8; the scale applied to the float32
sum) or bf16(fma(q, d, m)) (wint4), summing in float32 (`reference_values` gives these values).
wint8 is absmax symmetric per channel as FastDeploy's weight-only int8 (and LLM.int8's); wint4 is
asymmetric in groups of 32 as llama.cpp's Q4_1, not FastDeploy's per-channel symmetric int4: on the
default model (dequantized from Q4_1) symmetric int4 in groups of 64 doubled the perplexity, while
this keeps it within a few percent.

An MLP's gate_up (a Linear with activation "swiglu") is packed with its rows interleaved
(`swiglu_rows`): each panel holds 32 gate features then the same 32 up features, so the op computes
silu(gate) * up where it writes y, and y is the intermediate size wide.

Under tensor parallelism each rank packs its own shard (distributed/sharding.py); a row-parallel
weight's input columns arrive as a `ColumnShard`, and wint8 scales them by the whole rows' absmax
it carries, so the rank holds exactly its columns of what one process would pack.
"""
from typing import Callable, Optional, Sequence

import numpy as np
import paddle

from fastdeploy.model_executor.layers.linear import Linear, LinearMethod, QuantConfig, UnquantizedLinearMethod
from fastdeploy.model_executor.layers.parameters import empty_parameter
from fastdeploy.model_executor.model_loader.quantized import QuantizedTensor
from fastdeploy.model_executor.ops import compiled_op

BF16, WINT8, WINT4 = 30, 1008, 1004  # the op's kind ids (packed_linear.h)
KIND_IDS = {"bfloat16": BF16, "wint8": WINT8, "wint4": WINT4}
PANEL = 64  # output features per panel
INT4_GROUP = 32  # input features per wint4 scale and minimum
NO_BIAS = paddle.zeros([0], "float32")  # the op's bias input for a layer without one
# the op's `activation` for a Linear's (layers/linear.py ACTIVATIONS)
ACTIVATION_IDS = {None: 0, "quick_gelu": 1, "swiglu": 2}
SWIGLU_HALF = PANEL // 2  # gate (then up) features per panel of a "swiglu" weight


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (NaN kept a NaN)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    rounded = (u >> 16) & 1
    rounded += u
    rounded += 0x7FFF
    bits = (rounded >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        bits[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return bits


def bf16_values(a: np.ndarray) -> np.ndarray:
    """float32 -> float32 holding the nearest bfloat16 (round to nearest even)."""
    return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def quantize_int8(w: np.ndarray, amax: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """w [out, in] float32 -> (q [out, in] int8 in [-127, 127], s [out] float32), w ~ q * s[:, None];
    s = amax / 127, amax [out] being max |w[n]| unless given (>= it: the rows' absmax over more columns)."""
    amax = np.abs(w).max(axis=1) if amax is None else amax
    s = np.where(amax > 0, amax / 127, 1).astype(np.float32)
    return np.clip(np.rint(w / s[:, None]), -127, 127).astype(np.int8), s


def quantize_int4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w [out, in] float32 (in a multiple of 32) -> (q [out, in] uint8 in [0, 15], d, m [out, in / 32]
    float32), w ~ q * d + m, d and m repeated over each group of 32 inputs."""
    out, in_features = w.shape
    groups = w.reshape(out, in_features // INT4_GROUP, INT4_GROUP)
    low, high = groups.min(axis=2), groups.max(axis=2)
    d = np.where(high > low, (high - low) / 15, 1).astype(np.float32)
    q = np.clip(np.rint((groups - low[:, :, None]) / d[:, :, None]), 0, 15).astype(np.uint8)
    return q.reshape(out, in_features), d, low.astype(np.float32)


def reference_values(w: np.ndarray, kind: int) -> np.ndarray:
    """The [out, in] float32 weights the op computes with (wint8: q * s, the scale applied after the sum)."""
    if kind == BF16:
        return bf16_values(w)
    if kind == WINT8:
        q, s = quantize_int8(w)
        return q.astype(np.float32) * s[:, None]
    q, d, m = quantize_int4(w)
    exact = q * np.repeat(d, INT4_GROUP, axis=1).astype(np.float64) + np.repeat(m, INT4_GROUP, axis=1)
    return bf16_values(exact.astype(np.float32))


def packed_bytes(kind: int, out_features: int, in_features: int) -> int:
    """Size in bytes of `pack`'s result (weights then scales)."""
    panels, pairs = -(-out_features // PANEL), in_features // 2
    weight = panels * pairs * PANEL * 2 * {BF16: 2, WINT8: 1, WINT4: 0.5}[kind]
    scales = panels * {BF16: 0, WINT8: PANEL, WINT4: in_features // INT4_GROUP * 2 * PANEL}[kind]
    return int(weight) + 4 * scales


def _panel_pairs(values: np.ndarray) -> np.ndarray:
    """[out, in] -> [panels, in / 2, 64, 2] (rows padded with zeros to whole panels)."""
    out, in_features = values.shape
    panels = -(-out // PANEL)
    padded = values
    if out % PANEL:
        padded = np.zeros((panels * PANEL, in_features), values.dtype)
        padded[:out] = values
    return np.ascontiguousarray(padded.reshape(panels, PANEL, in_features // 2, 2).transpose(0, 2, 1, 3))


def swiglu_padded(inter: int) -> int:
    """The gate (and up) rows swiglu_rows gives an intermediate size: inter rounded up to 32."""
    return -(-inter // SWIGLU_HALF) * SWIGLU_HALF


def swiglu_rows(w: np.ndarray) -> np.ndarray:
    """[2 inter, in] rows [gate | up] -> [2 inter', in] rows in the op's SwiGLU order, inter' = swiglu_padded(inter):
    block b holds gate rows 32 b..32 b + 31 then up rows 32 b..32 b + 31, zero rows past inter."""
    inter, in_features = w.shape[0] // 2, w.shape[1]
    padded = swiglu_padded(inter)
    halves = np.zeros((2, padded, in_features), w.dtype)  # gate, up, each padded
    halves[0, :inter], halves[1, :inter] = w[:inter], w[inter:]
    blocks = padded // SWIGLU_HALF
    return halves.reshape(2, blocks, SWIGLU_HALF, in_features).transpose(1, 0, 2, 3).reshape(-1, in_features)


def pack(w: np.ndarray, kind: int, row_absmax: Optional[np.ndarray] = None) -> np.ndarray:
    """w [out, in] float32 (HF orientation) -> the op's uint8 layout, packed_bytes(kind, out, in) long.
    row_absmax [out]: wint8's absmax per output feature when w is some columns of the rows (ColumnShard)."""
    out, in_features = w.shape
    if kind == BF16:
        return _panel_pairs(bf16_bits(w)).view(np.uint8).reshape(-1)
    if kind == WINT8:
        q, s = quantize_int8(w, row_absmax)
        scales = np.zeros(-(-out // PANEL) * PANEL, np.float32)
        scales[:out] = s
        return np.concatenate([_panel_pairs(q).view(np.uint8).reshape(-1), scales.view(np.uint8)])
    q, d, m = quantize_int4(w)
    lanes = _panel_pairs(q).reshape(-1, in_features // 2, 4, 32)  # per pair: 4 registers of 32 lanes
    nibbles = lanes[..., :16] | (lanes[..., 16:] << 4)  # byte i: lane i low, lane i + 16 high
    panels = lanes.shape[0]
    scales = np.zeros((panels * PANEL, d.shape[1], 2), np.float32)  # [padded out, groups, (d, m)]
    scales[:out, :, 0], scales[:out, :, 1] = d, m
    scales = scales.reshape(panels, PANEL, -1, 2).transpose(0, 2, 3, 1)  # [panels, groups, (d, m), 64]
    return np.concatenate([nibbles.reshape(-1), np.ascontiguousarray(scales).view(np.uint8).reshape(-1)])


def input_multiple(kind: int) -> int:
    """What a weight's in_features must be a multiple of for the op to take it as `kind`: 2 (input
    features in pairs), 32 for wint4 (its groups)."""
    return INT4_GROUP if kind == WINT4 else 2


def kind_fits(kind: int, in_features: int) -> bool:
    """Whether the op takes a weight of this kind with `in_features` inputs."""
    return in_features % input_multiple(kind) == 0


class ColumnShard(np.ndarray):
    """Some input columns [out, in_part] float32 of a weight [out, in], as a row-parallel layer's
    rank holds them under tensor parallelism (distributed/sharding.py), with `row_absmax` [out]: max
    |W[n, :]| over the whole row. wint8 scales each output feature by it, so every rank's int8
    columns and scales are exactly those of the whole matrix packed in one process."""

    row_absmax: np.ndarray


def column_shard(columns: np.ndarray, row_absmax: np.ndarray) -> ColumnShard:
    """columns [out, in_part] carrying row_absmax [out] (see ColumnShard)."""
    shard = columns.view(ColumnShard)
    shard.row_absmax = np.ascontiguousarray(row_absmax, np.float32)
    return shard


LM_HEAD_SOURCES = ("lm_head.weight", "model.embed_tokens.weight")  # lm_head's checkpoint tensor (tied or not)


def lm_head_kind(kind: int) -> int:
    """The kind lm_head (and a tied embedding reading it) is packed as: wint4 models keep it in wint8,
    as GPTQ/AWQ keep lm_head out of 4 bits (on the default model, 4-bit lm_head alone cost ~4% perplexity)."""
    return WINT8 if kind == WINT4 else kind


class PackedConfig(QuantConfig):
    """Every Linear packed as `kind` (BF16, WINT8 or WINT4; lm_head as lm_head_kind) where the op is
    built and the shape suits it."""

    def __init__(self, kind: int):
        self.kind = kind

    def linear_method(self, checkpoint_names: Sequence[str]) -> LinearMethod:
        linear, rows = compiled_op("fd_packed_linear"), compiled_op("fd_packed_embedding")
        if linear is None:
            return UnquantizedLinearMethod()
        kind = lm_head_kind(self.kind) if set(checkpoint_names) & set(LM_HEAD_SOURCES) else self.kind
        return PackedLinearMethod(kind, linear, rows)


class PackedLinearMethod(LinearMethod):
    """W packed as `kind`; shards are staged as float32 until all have arrived, then packed once. A layer
    whose in_features the kind cannot take stays dense float32 (decided at create_weights)."""

    def __init__(self, kind: int, linear_op: Callable, rows_op: Callable):
        self.kind = kind
        self._linear = linear_op
        self._rows = rows_op
        self._dense: Optional[UnquantizedLinearMethod] = None  # set when the shape does not fit
        self._staged: Optional[np.ndarray] = None  # [out, in] float32 while shards arrive
        self._staged_rows = 0
        self._row_absmax: Optional[np.ndarray] = None  # a ColumnShard's (a row-parallel layer: one shard)

    def create_weights(self, layer: Linear) -> paddle.Tensor:
        if not kind_fits(self.kind, layer.in_features):
            self._dense = UnquantizedLinearMethod()
            return self._dense.create_weights(layer)
        rows = 2 * swiglu_padded(layer.out_features // 2) if layer.activation == "swiglu" else layer.out_features
        size = packed_bytes(self.kind, rows, layer.in_features)
        return empty_parameter([size], "uint8", layer.weight_loader)

    def load(self, layer: Linear, loaded, start: int, end: int) -> None:
        if self._dense is not None:
            return self._dense.load(layer, loaded, start, end)
        if isinstance(loaded, QuantizedTensor):
            loaded = loaded.dequantize()
        if self._staged is None:
            self._staged = np.empty((layer.out_features, layer.in_features), np.float32)
        self._staged[start:end] = loaded
        self._staged_rows += end - start
        if isinstance(loaded, ColumnShard):
            self._row_absmax = loaded.row_absmax
        if self._staged_rows == layer.out_features:  # every shard is in: pack once
            rows = swiglu_rows(self._staged) if layer.activation == "swiglu" else self._staged
            np.from_dlpack(layer.weight)[...] = pack(rows, self.kind, self._row_absmax)
            self._staged, self._staged_rows, self._row_absmax = None, 0, None

    def apply(self, layer: Linear, x: paddle.Tensor) -> paddle.Tensor:
        # x: [n, in] -> [n, out]
        if self._dense is not None:
            return self._dense.apply(layer, x)
        bias = layer.bias if layer.bias is not None else NO_BIAS  # added where the op writes y, as the activation
        activation = ACTIVATION_IDS[layer.activation]
        columns = layer.out_features // 2 if layer.activation == "swiglu" else layer.out_features
        return self._linear(x, layer.weight, bias, self.kind, columns, False, activation)

    def operand(self, layer: Linear, rows: int) -> tuple[paddle.Tensor, int]:
        return (layer.weight, 0) if self._dense is not None else (layer.weight, self.kind)

    @property
    def packed(self) -> bool:
        """False when the layer's shape made it dense float32."""
        return self._dense is None

    def rows(self, layer: Linear, ids: paddle.Tensor) -> paddle.Tensor:
        """ids [n] int64 -> W[ids] [n, in] float32 as the matmul uses them (a tied embedding's lookup)."""
        return self._rows(ids, layer.weight, self.kind, layer.out_features, layer.in_features)
