"""How `LLM.score` turns text pairs into scores, shared with the API server's `/v1/score`.

- `score_pairs(text_1, text_2)`: the pairs of 1 -> 1, 1 -> N or N -> N texts.
- `ScorePlan`: the pooling prompts that score the pairs, and `scores(outputs)`, which reads the
  pairs' ScoringRequestOutputs from their outputs. A cross-encoder (a one-label classification
  model) runs one prompt per pair (the pair as one sequence); an embedding model embeds each distinct
  text once and scores a pair by the cosine similarity of its two embeddings.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from fastdeploy.engine.pooling_output import ScoringOutput, ScoringRequestOutput
from fastdeploy.model_executor.layers.pooler import cosine_similarity


def score_pairs(text_1, text_2) -> list[tuple[str, str]]:
    """The (text_1, text_2) pairs: 1 -> 1, 1 -> N or N -> N; ValueError for empty or unequal lists,
    TypeError for anything but str and lists of str (the messages name text_1 / text_2)."""
    firsts = [text_1] if isinstance(text_1, str) else text_1
    seconds = [text_2] if isinstance(text_2, str) else text_2
    for name, texts in (("text_1", firsts), ("text_2", seconds)):
        if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
            raise TypeError(f"{name} must be a str or a list of str, got {texts!r}")
        if not texts:
            raise ValueError(f"{name} is empty: give at least one text")
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds):
        raise ValueError(f"text_1 and text_2 must pair 1 -> 1, 1 -> N or N -> N; got {len(firsts)} and "
                         f"{len(seconds)} texts")
    return list(zip(firsts, seconds))


@dataclass
class ScorePlan:
    """The prompts that score `pairs`. `texts` None: a cross-encoder, requests[i] scores pairs[i];
    else an embedding model, requests[i] embeds texts[i] (each distinct text of the pairs once)."""

    pairs: list[tuple[str, str]]
    requests: list  # validated PreparedPrompts, ready for LLMEngine.enqueue
    texts: Optional[list[str]] = None

    def scores(self, outputs: list) -> list[ScoringRequestOutput]:
        """The pairs' ScoringRequestOutputs, in pair order, from `outputs` (the requests' outputs, in
        request order). An embedding model's pair gets the cosine of its texts' embeddings, the
        request id "<id of text_1's>-<id of text_2's>" and both texts' token ids."""
        if self.texts is None:
            return outputs
        by_text = dict(zip(self.texts, outputs))
        return [ScoringRequestOutput(
                    request_id=f"{by_text[a].request_id}-{by_text[b].request_id}", prompt=a,
                    prompt_token_ids=by_text[a].prompt_token_ids + by_text[b].prompt_token_ids,
                    outputs=ScoringOutput(np.array([cosine_similarity(by_text[a].outputs.data,
                                                                      by_text[b].outputs.data)], np.float32)))
                for a, b in self.pairs]


def distinct_texts(pairs: list[tuple[str, str]]) -> list[str]:
    """Each text of the pairs once, in first-seen order."""
    return list(dict.fromkeys(text for pair in pairs for text in pair))
