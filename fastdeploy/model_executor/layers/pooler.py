"""The pooler: a prompt's hidden states -> its pooling output (sentence-transformers' Pooling and Normalize
modules, vLLM's poolers), on the float32 rows the model returned for one step.

Pooling types (config.py POOLING_TYPES): LAST (the last token's row: decoder embedders such as
Qwen3-Embedding, whose tokenizer appends EOS), CLS (the first row: BERT's [CLS]), MEAN (the mean of the
prompt's rows), ALL (every row). Then per task:
- embed: the first `dimensions` values (Matryoshka truncation), then L2-normalised when `normalize`
  (truncate, then normalise: the order Matryoshka models are trained in);
- classify / score: the model's head (`model.classify`) on the pooled row, then softmax over the labels
  (sigmoid for one label) when `activation`;
- reward: the head on every row (ALL), no activation.
"""
from __future__ import annotations

import numpy as np

NORM_EPS = 1e-12  # as torch.nn.functional.normalize, which sentence-transformers' Normalize calls


def pool(hidden: np.ndarray, start: int, end: int, pooling_type: str) -> np.ndarray:
    """Rows [start, end) of hidden [num_tokens, hidden] pooled: [hidden] (LAST, CLS, MEAN) or
    [end - start, hidden] (ALL)."""
    rows = hidden[start:end]
    if pooling_type == "LAST":
        return rows[-1]
    if pooling_type == "CLS":
        return rows[0]
    if pooling_type == "MEAN":
        return rows.mean(axis=0, dtype=np.float64).astype(np.float32)
    if pooling_type == "ALL":
        return rows
    raise ValueError(f"unknown pooling type {pooling_type!r}")


def embedding(pooled: np.ndarray, dimensions, normalize: bool) -> np.ndarray:
    """pooled [hidden] -> the embedding [dimensions or hidden] float32: truncated, then L2-normalised."""
    x = pooled[:dimensions] if dimensions else pooled
    x = x.astype(np.float32, copy=True)
    if normalize:
        x /= max(float(np.linalg.norm(x.astype(np.float64))), NORM_EPS)
    return x


def activation(logits: np.ndarray) -> np.ndarray:
    """logits [..., num_labels] -> probabilities: softmax over the labels, or the sigmoid for one label."""
    logits = logits.astype(np.float64)
    if logits.shape[-1] == 1:
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two vectors (LLM.score on an embedding model), computed in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), NORM_EPS))
