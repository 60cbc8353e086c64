"""Token embedding: ids [n] int64 -> rows of `weight` [vocab, hidden] float32 (GGUF blocks dequantized at load)."""
import paddle
import paddle.nn.functional as F

from fastdeploy.model_executor.layers.parameters import empty_parameter


class VocabEmbedding(paddle.nn.Layer):
    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.weight = empty_parameter([vocab_size, hidden_size])

    def forward(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        return F.embedding(input_ids, self.weight)  # [n] -> [n, hidden]
