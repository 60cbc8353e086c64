"""Decoder LMs as pooling models: the zoo's CausalLM classes without lm_head, with a classification head when
the task needs one (vLLM's `as_embedding_model` / `as_seq_cls_model` adapters).

- embed (Qwen3-Embedding, gte-Qwen2, any decoder with `LLM(convert="embed")`): hidden states only; the
  runner's pooler (layers/pooler.py) picks the rows.
- classify / reward (`Qwen2ForSequenceClassification`, `Qwen3ForSequenceClassification`,
  `LlamaForSequenceClassification`; transformers' layout): `score`, a bias-free Linear [hidden -> num_labels]
  applied by `classify(pooled)`.
- a token classifier (the Qwen3-Reranker form): config.json (or `LLM(hf_overrides=)`) names
  `classifier_from_token`, e.g. ["no", "yes"]; the engine resolves them to `classifier_token_ids`
  (engine/pooling_setup.py) and `score` is loaded from those rows of lm_head (or of the tied embedding).
  With `is_original_qwen3_reranker` (vLLM's flag) the head is one label, row(yes) - row(no): its sigmoid
  is softmax([logit_no, logit_yes])[1], the model card's relevance score.

Checkpoints saved from the base model (`Qwen3Model`: names without the "model." prefix, as
sentence-transformers writes Qwen3-Embedding) load as well; an lm_head in the checkpoint is ignored.
"""
from __future__ import annotations

from typing import Iterable, Optional

import numpy as np
import paddle

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.layers.linear import Linear, QuantConfig, select_linear_method

HEAD_PREFIXES = ("model.", "score.", "lm_head.")


def num_labels(config: ModelConfig) -> int:
    """Labels of a classification head: the classifier tokens (one for the Qwen3-Reranker form), else
    config.json's (ModelConfig.num_labels)."""
    hf = config.hf_config
    if hf.get("classifier_token_ids"):
        return 1 if hf.get("is_original_qwen3_reranker") else len(hf["classifier_token_ids"])
    return config.num_labels


def as_pooling_model(causal_lm_cls, task: str):
    """A subclass of `causal_lm_cls` (a models/ CausalLM) for pooling `task` ("embed", "classify", "reward")."""

    class PoolingModel(causal_lm_cls):
        has_lm_head = False

        def __init__(self, config: ModelConfig, block_size: int, max_model_len: int,
                     quant_config: Optional[QuantConfig] = None):
            super().__init__(config, block_size, max_model_len, quant_config)
            self.num_labels = 0
            if task in ("classify", "reward"):
                self.num_labels = num_labels(self.config)
                self.score = Linear(self.config.hidden_size, {None: self.num_labels}, False,
                                    select_linear_method(None, ["score.weight"]))  # float32: a few rows

        def classify(self, pooled: paddle.Tensor) -> paddle.Tensor:
            """pooled [m, hidden] -> logits [m, num_labels] float32."""
            return self.score(pooled)

        def load_weights(self, weights: Iterable[tuple[str, object]]) -> None:
            super().load_weights(self._renamed(weights))

        def _renamed(self, weights):
            token_ids = self.config.hf_config.get("classifier_token_ids")
            head_source = "model.embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
            for name, tensor in weights:
                if not name.startswith(HEAD_PREFIXES):
                    name = "model." + name  # the base model's names (Qwen3Model)
                if token_ids and self.num_labels and name == head_source:
                    yield "score.weight", self._token_rows(np.asarray(tensor), token_ids)
                if name.startswith("lm_head."):
                    continue
                yield name, tensor

        def _token_rows(self, table: np.ndarray, token_ids: list) -> np.ndarray:
            """[num_labels, hidden] from the vocabulary rows [vocab, hidden] of the classifier tokens."""
            rows = table[np.asarray(token_ids)]
            if self.num_labels == 1 and len(token_ids) == 2:
                return rows[1:] - rows[:1]  # logit(yes) - logit(no)
            return rows

        def expected_weight_names(self) -> list[str]:
            return [name for name in super().expected_weight_names() if not name.startswith("lm_head.")]

    PoolingModel.__name__ = PoolingModel.__qualname__ = f"{causal_lm_cls.__name__}As{task.capitalize()}"
    return PoolingModel
