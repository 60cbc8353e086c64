"""Token embedding: ids [n] int64 -> rows [n, hidden] float32.

`VocabEmbedding` holds its own `weight` [vocab, hidden] float32 (a float checkpoint's values, or GGUF
blocks dequantized at load where they cannot stay blocks).
`GGUFEmbedding` holds the embedding as GGUF blocks (a GGUF file whose `token_embd.weight` is of a type
the compiled ops read: quantized.LINEAR_QTYPES), in the layout a GGUF linear holds them, and dequantizes
the looked-up rows (the `gguf_embedding` op: gguf-py's `dequantize` values), so it holds the file's size.
`TiedEmbedding` holds nothing: with tied embeddings and an lm_head held packed (bf16, wint8, wint4;
layers/quantization/packed.py) or in GGUF blocks (layers/quantization/gguf.py) it reads the rows of
lm_head's copy, so the model keeps one.
`make_embedding` picks between the first two when the model is built.
"""
from typing import Optional

import paddle
import paddle.nn.functional as F

from fastdeploy.model_executor.layers.linear import LinearMethod, QuantConfig
from fastdeploy.model_executor.layers.parameters import check_shape, empty_parameter
from fastdeploy.model_executor.layers.quantization.gguf import GGUFConfig, GGUFLinearMethod
from fastdeploy.model_executor.layers.quantization.packed import PackedLinearMethod
from fastdeploy.model_executor.ops import compiled_op

EMBEDDING = "model.embed_tokens.weight"  # the checkpoint tensor (GGUF: token_embd.weight)


class VocabEmbedding(paddle.nn.Layer):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.weight = empty_parameter([vocab_size, hidden_size])

    def forward(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        return F.embedding(input_ids, self.weight)  # [n] -> [n, hidden]


class GGUFEmbedding(paddle.nn.Layer):
    """weight: a [vocab, hidden] matrix of GGUF type `method.qtype` as `method` (a GGUFLinearMethod) holds
    it (quantized.block_shape: the file's bytes, or Q4_0 / Q4_1 / Q8_0 interleaved); looked-up rows are
    dequantized by `method.rows`. Loading takes the file's QuantizedTensor of that type (ValueError
    naming the types otherwise) of shape [vocab, hidden] (ValueError naming the shapes otherwise)."""

    def __init__(self, vocab_size: int, hidden_size: int, method: GGUFLinearMethod):
        super().__init__()
        self.out_features, self.in_features = vocab_size, hidden_size  # the method's layer contract
        self.method = method
        self.weight = method.create_weights(self)

    def weight_loader(self, param: paddle.Tensor, loaded, shard_id=None) -> None:
        check_shape(loaded, (self.out_features, self.in_features))
        self.method.load(self, loaded, 0, self.out_features)

    def forward(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        return self.method.rows(self, input_ids)  # [n] -> [n, hidden]


class TiedEmbedding(paddle.nn.Layer):
    """Rows of a tied lm_head's packed or GGUF weight (its method's `rows`): the values its matmul uses."""

    def __init__(self, lm_head: paddle.nn.Layer):
        super().__init__()
        self._lm_head = [lm_head]  # a list: not registered as a sublayer, so its weight is listed once

    def forward(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        lm_head = self._lm_head[0]
        return lm_head.method.rows(lm_head, input_ids)  # [n] -> [n, hidden]


def reads_rows(method: LinearMethod) -> bool:
    """Whether a tied embedding can read its rows from an lm_head of `method` (`TiedEmbedding`): packed
    (not its float32 fallback), or GGUF blocks with the compiled `gguf_embedding` op."""
    if isinstance(method, PackedLinearMethod):
        return method.packed
    return isinstance(method, GGUFLinearMethod) and compiled_op("gguf_embedding") is not None


def make_embedding(vocab_size: int, hidden_size: int, quant_config: Optional[QuantConfig]) -> paddle.nn.Layer:
    """A `GGUFEmbedding` when `quant_config` is a GGUF file's whose embedding a GGUF linear would hold in
    blocks (GGUFConfig.linear_method) and `gguf_embedding` is compiled; else a float32 `VocabEmbedding`."""
    if isinstance(quant_config, GGUFConfig):
        method = quant_config.linear_method([EMBEDDING])
        if isinstance(method, GGUFLinearMethod) and reads_rows(method):
            return GGUFEmbedding(vocab_size, hidden_size, method)
    return VocabEmbedding(vocab_size, hidden_size)
