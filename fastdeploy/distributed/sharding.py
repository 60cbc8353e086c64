"""How a checkpoint is cut into tensor-parallel shards (Megatron-LM's scheme, Shoeybi et al. 2019).

Per decoder layer, with N ranks:
- attention: rank r holds a contiguous range of KV heads and the query heads of their GQA groups:
  q_proj/k_proj/v_proj are split by output rows (column parallel), o_proj by input columns (row
  parallel). KV heads are spread as evenly as they go (9 query / 3 KV heads on 2 ranks: 6/2 and
  3/1), so every rank needs at least one: num_key_value_heads < N is refused (no replication).
- MLP, every MoE expert and the shared experts: gate_proj/up_proj split by output rows,
  down_proj by input columns, evenly (intermediate sizes must divide by N). Experts are sharded
  inside (each rank holds 1/N of every expert), so routing, done on every rank from the replicated
  router, needs no communication.
- the rank's partial o_proj and MLP outputs are summed by one all-reduce each (layers/decoder_layer.py);
  the biases of o_proj and down_proj are kept by rank 0 only (zeros elsewhere) so they count once.
- embed_tokens and lm_head are split by vocabulary rows into ceil(V / N) rows per rank, the last
  padded with zero rows; the embedding lookup is summed over ranks, the logits gathered and cut
  back to V columns (layers/parallel.py).
- norms, the MoE router and ERNIE's moe_statics are replicated.

GGUF matrices stay quantized: a row split cuts whole rows; a column split must fall on a block
boundary (quantized.block_values: 256 weights for the K-quants, 32 for the others), which
`check_quantized_split` verifies before loading.

The packed formats (bf16, wint8, wint4: layers/quantization/packed.py) are packed by each rank from
its own float shard, in the layout of its local sizes (64-feature panels, the gate_up SwiGLU
interleave over its own gate and up rows). A row-parallel weight's columns come as a ColumnShard
carrying the whole rows' absmax, so wint8's per-output-feature scales are one process's; wint4's
groups of 32 inputs are one process's when every rank's input columns are a multiple of 32, which
`check_packed_split` requires before loading (bf16 and wint8: an even number). Every rank therefore
holds exactly its slice of what one process would hold.

Each rank then builds the ordinary model from `local_config()` (its head counts, intermediate
sizes and vocabulary rows) and loads `shard_weights(...)`: weights are sliced as they stream from
the checkpoint, so a rank never holds more than its shard plus one tensor.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Iterator

import numpy as np

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.layers.quantization.packed import KIND_IDS, column_shard, input_multiple
from fastdeploy.model_executor.model_loader.quantized import QuantizedTensor, block_values


_QUERY_ROWS = re.compile(r"\.self_attn\.q_proj\.(weight|bias)$")
_KV_ROWS = re.compile(r"\.self_attn\.[kv]_proj\.(weight|bias)$")
_O_WEIGHT, _O_BIAS = re.compile(r"\.self_attn\.o_proj\.weight$"), re.compile(r"\.self_attn\.o_proj\.bias$")
_MLP_ROWS = re.compile(r"\.(gate_proj|up_proj)\.(weight|bias)$")
_DOWN_WEIGHT, _DOWN_BIAS = re.compile(r"\.down_proj\.weight$"), re.compile(r"\.down_proj\.bias$")
_VOCAB_ROWS = ("model.embed_tokens.weight", "lm_head.weight", "lm_head.bias")


def moe_intermediate_size(config: ModelConfig) -> int:
    """The experts' intermediate size (config.json's `moe_intermediate_size`), 0 for a dense model."""
    return int(config.hf_config.get("moe_intermediate_size") or 0)


def check_tensor_parallel(config: ModelConfig, size: int) -> None:
    """ValueError naming the numbers when the model cannot be split over `size` ranks (before loading)."""
    if size == 1:
        return
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if kv_heads < size:
        raise ValueError(
            f"tensor_parallel_size={size} exceeds the model's num_key_value_heads={kv_heads}: every rank needs at "
            f"least one KV head (replicating KV heads is not supported); use tensor_parallel_size <= {kv_heads}")
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    for name, value in (("intermediate_size", config.intermediate_size),
                        ("moe_intermediate_size", moe_intermediate_size(config))):
        if value % size:
            raise ValueError(f"the model's {name}={value} does not divide by tensor_parallel_size={size}; "
                             f"the MLP is split evenly over the ranks")


def kv_head_range(num_kv_heads: int, size: int, rank: int) -> tuple[int, int]:
    """[start, end) of the KV heads rank `rank` holds: as even as possible, the first ranks one more."""
    base, extra = divmod(num_kv_heads, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


class TensorParallelShard:
    """Rank `rank` of `size`'s part of a model whose full configuration is `config`."""

    def __init__(self, config: ModelConfig, rank: int, size: int):
        check_tensor_parallel(config, size)
        self.config, self.rank, self.size = config, rank, size
        group = config.num_attention_heads // config.num_key_value_heads
        kv_start, kv_end = kv_head_range(config.num_key_value_heads, size, rank)
        dim = config.head_dim
        self.kv_rows = (kv_start * dim, kv_end * dim)  # rows of k_proj / v_proj
        self.q_rows = (kv_start * group * dim, kv_end * group * dim)  # rows of q_proj = columns of o_proj
        self.local_vocab = -(-config.vocab_size // size)
        self.vocab_rows = (rank * self.local_vocab, min((rank + 1) * self.local_vocab, config.vocab_size))

    def local_config(self) -> ModelConfig:
        """The configuration this rank builds its model from: its heads and intermediate sizes (vocab_size
        stays the full vocabulary: the vocabulary-parallel layers take their rows from it)."""
        c, n = self.config, self.size
        kv = (self.kv_rows[1] - self.kv_rows[0]) // c.head_dim
        hf = dict(c.hf_config)
        if moe_intermediate_size(c):
            hf["moe_intermediate_size"] = moe_intermediate_size(c) // n
        return dataclasses.replace(c, num_attention_heads=kv * (c.num_attention_heads // c.num_key_value_heads),
                                   num_key_value_heads=kv, intermediate_size=c.intermediate_size // n,
                                   hf_config=hf)

    def check_quantized_split(self, tensor_types: dict) -> None:
        """ValueError before loading when a GGUF matrix kept quantized would be cut inside a block.

        tensor_types: HF name -> ggml type of the matrices handed over as QuantizedTensors."""
        for name, qtype in tensor_types.items():
            if _O_WEIGHT.search(name) or _DOWN_WEIGHT.search(name):
                width = (self.q_rows[1] - self.q_rows[0] if _O_WEIGHT.search(name)
                         else (moe_intermediate_size(self.config) if ".experts." in name
                               else self.config.intermediate_size) // self.size)
                if width % block_values(qtype):
                    raise ValueError(
                        f"tensor_parallel_size={self.size}: rank {self.rank}'s {width} input columns of the "
                        f"quantized {name!r} are not a multiple of the GGUF block ({block_values(qtype)} weights)")

    def row_parallel_inputs(self) -> dict[str, tuple[int, str]]:
        """This rank's input features of each row-parallel weight: {layer name pattern: (width, how it
        follows from the config)} (a shared expert's width is a multiple of the experts')."""
        c, n, moe = self.config, self.size, moe_intermediate_size(self.config)
        query = self.q_rows[1] - self.q_rows[0]
        widths = {
            "model.layers.*.self_attn.o_proj": (query, f"{query // c.head_dim} query heads x head_dim={c.head_dim}"),
            "model.layers.*.mlp.down_proj": (c.intermediate_size // n,
                                             f"intermediate_size={c.intermediate_size} / {n}"),
        }
        if moe:
            widths["model.layers.*.mlp.experts.*.down_proj"] = (moe // n, f"moe_intermediate_size={moe} / {n}")
        return widths

    def check_packed_split(self, kind: int) -> None:
        """ValueError before loading when a row-parallel weight's input columns on this rank do not suit
        packed `kind` (a multiple of wint4's 32-input groups; even for bf16 and wint8), naming the layer
        and the sizes: one process would pack it, this rank could not."""
        multiple, name = input_multiple(kind), {v: k for k, v in KIND_IDS.items()}[kind]
        for layer, (width, how) in self.row_parallel_inputs().items():
            if width % multiple:
                raise ValueError(
                    f"tensor_parallel_size={self.size} with {name} weights: rank {self.rank} would hold {width} "
                    f"input features of {layer} ({how}), not a multiple of {multiple} as {name} needs; choose "
                    f"a tensor_parallel_size that keeps them one, or another weight format")

    def shard_weights(self, weights: Iterable[tuple[str, object]]) -> Iterator[tuple[str, object]]:
        """(name, this rank's part of the tensor) for each checkpoint tensor (see the module docstring)."""
        for name, tensor in weights:
            yield name, self.shard(name, tensor)

    def shard(self, name: str, tensor):
        """This rank's part of checkpoint tensor `name` (numpy [out, in] / [out], or a QuantizedTensor)."""
        if name in _VOCAB_ROWS:
            return _pad_rows(_rows(tensor, *self.vocab_rows), self.local_vocab)
        if _QUERY_ROWS.search(name):
            return _rows(tensor, *self.q_rows)
        if _KV_ROWS.search(name):
            return _rows(tensor, *self.kv_rows)
        if _O_WEIGHT.search(name):
            return _columns(tensor, *self.q_rows)
        if _MLP_ROWS.search(name):
            return _rows(tensor, *self._even(tensor.shape[0], name))
        if _DOWN_WEIGHT.search(name):
            return _columns(tensor, *self._even(tensor.shape[1], name))
        if _O_BIAS.search(name) or _DOWN_BIAS.search(name):
            return tensor if self.rank == 0 else np.zeros_like(tensor)
        return tensor

    def _even(self, total: int, name: str) -> tuple[int, int]:
        if total % self.size:
            raise ValueError(f"checkpoint tensor {name!r}: {total} features do not divide by "
                             f"tensor_parallel_size={self.size}")
        part = total // self.size
        return self.rank * part, (self.rank + 1) * part


def _rows(tensor, start: int, end: int):
    if isinstance(tensor, QuantizedTensor):
        return QuantizedTensor(np.ascontiguousarray(tensor.blocks[start:end]), tensor.qtype, tensor.in_features)
    return np.ascontiguousarray(tensor[start:end])


def _columns(tensor, start: int, end: int):
    """Input columns start:end: GGUF blocks, or a float ColumnShard (with the whole rows' absmax)."""
    if isinstance(tensor, QuantizedTensor):
        block = block_values(tensor.qtype)
        block_bytes = tensor.blocks.shape[1] // (tensor.in_features // block)
        lo, hi = start // block * block_bytes, end // block * block_bytes
        return QuantizedTensor(np.ascontiguousarray(tensor.blocks[:, lo:hi]), tensor.qtype, end - start)
    absmax = np.maximum(tensor.max(axis=1), -tensor.min(axis=1))  # no |tensor| temporary
    return column_shard(np.ascontiguousarray(tensor[:, start:end]), absmax)


def _pad_rows(tensor, rows: int):
    """tensor with zero rows appended up to `rows` (zero GGUF blocks dequantize to zeros)."""
    missing = rows - tensor.shape[0]
    if missing == 0:
        return tensor
    if isinstance(tensor, QuantizedTensor):
        blocks = np.concatenate([tensor.blocks, np.zeros((missing, tensor.blocks.shape[1]), np.uint8)])
        return QuantizedTensor(blocks, tensor.qtype, tensor.in_features)
    return np.concatenate([tensor, np.zeros((missing, *tensor.shape[1:]), tensor.dtype)])
