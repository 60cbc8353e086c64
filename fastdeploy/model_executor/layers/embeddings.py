"""Token embedding: ids [n] int64 -> rows [n, hidden] float32.

`VocabEmbedding` holds its own `weight` [vocab, hidden] float32 (GGUF blocks dequantized at load).
`TiedEmbedding` holds nothing: with tied embeddings and an lm_head held packed (bf16, wint8, wint4;
layers/quantization/packed.py) it reads the rows of lm_head's copy, so the model keeps one.
"""
import paddle
import paddle.nn.functional as F

from fastdeploy.model_executor.layers.parameters import empty_parameter


class VocabEmbedding(paddle.nn.Layer):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.weight = empty_parameter([vocab_size, hidden_size])

    def forward(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        return F.embedding(input_ids, self.weight)  # [n] -> [n, hidden]


class TiedEmbedding(paddle.nn.Layer):
    """Rows of a tied lm_head's packed weight (`PackedLinearMethod.rows`): the values its matmul uses."""

    def __init__(self, lm_head: paddle.nn.Layer):
        super().__init__()
        self._lm_head = [lm_head]  # a list: not registered as a sublayer, so its weight is listed once

    def forward(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        lm_head = self._lm_head[0]
        return lm_head.method.rows(lm_head, input_ids)  # [n] -> [n, hidden]
