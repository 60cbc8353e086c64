"""XLM-RoBERTa (Conneau et al. 2020) and RoBERTa (Liu et al. 2019): BERT's encoder (models/bert.py) with
two differences, as transformers' modeling_xlm_roberta:

  * positions start after the padding index: position_embeddings row = pad_token_id + 1 + position
    (fairseq's make_positions for a sequence without padding; pad_token_id is 1 in the released models, so
    a 514-row table serves 512 tokens);
  * the classification head reads the <s> row directly: out_proj(tanh(dense(row))) under `classifier.`
    (no BERT pooler: `pooler.*` tensors are ignored).

Checkpoints name the base model "roberta." in *For* checkpoints, nothing in plain-model ones (bge-m3).
"""
from typing import Optional

import paddle

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.layers.linear import QuantConfig
from fastdeploy.model_executor.models.bert import BertModel, dense


class XLMRobertaModel(BertModel):
    """BertModel with positions offset by pad_token_id + 1 (config.json's `pad_token_id`, 1 by default:
    ModelConfig.position_offset)."""

    PREFIX = "roberta"


class XLMRobertaClassificationHead(paddle.nn.Layer):
    def __init__(self, hidden_size: int, num_labels: int):
        super().__init__()
        self.dense = dense(hidden_size, hidden_size)
        self.out_proj = dense(hidden_size, num_labels)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.out_proj(paddle.tanh(self.dense(x)))  # [m, hidden] -> [m, num_labels]


class XLMRobertaForSequenceClassification(XLMRobertaModel):
    """XLMRobertaModel plus `classifier` (dense, out_proj); `classify` gives the logits (the bge-reranker
    cross-encoders: num_labels 1)."""

    def __init__(self, config: ModelConfig, block_size: int, max_model_len: int,
                 quant_config: Optional[QuantConfig] = None):
        super().__init__(config, block_size, max_model_len, quant_config)
        self.num_labels = config.num_labels
        self.classifier = XLMRobertaClassificationHead(config.hidden_size, self.num_labels)

    def classify(self, pooled: paddle.Tensor) -> paddle.Tensor:
        """pooled [m, hidden] float32 (each sequence's <s> row of forward's output) -> logits [m, num_labels]
        float32: classifier.out_proj(tanh(classifier.dense(pooled))), transformers'
        XLMRobertaClassificationHead."""
        return self.classifier(pooled)
