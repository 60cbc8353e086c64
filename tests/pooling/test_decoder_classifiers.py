"""Decoder pooling heads against transformers on the same tiny checkpoints: `*ForSequenceClassification`
(probabilities of the last token's logits, per-token rewards, one-label cross-encoder scores) and the
Qwen3-Reranker form (a causal LM whose "yes"/"no" logits give the relevance score)."""
import numpy as np
import pytest
import torch

from fastdeploy import LLM, PoolingParams
from helpers import assert_engine_idle
from pooling_checkpoints import make_decoder_classifier

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello world!", "def f(x): return x + 1", "fox " * 30]


def hf_logits(model, tok, text: str) -> np.ndarray:
    """transformers' per-token score head output [tokens, labels] on `text` tokenized as our engine does."""
    ids = tok(text)["input_ids"]
    with torch.no_grad():
        hidden = model.model(torch.tensor([ids])).last_hidden_state[0]
        return model.score(hidden).numpy()


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_classification_probabilities_equal_transformers(tmp_path, family):
    from transformers import AutoTokenizer

    hf = make_decoder_classifier(tmp_path, family, num_labels=3)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    llm = LLM(str(tmp_path), dtype="float32")
    assert llm.llm_engine.config.pooler_config.pooling_type == "LAST"
    outs = llm.classify(TEXTS, use_tqdm=False)
    for text, out in zip(TEXTS, outs):
        ids = tok(text, return_tensors="pt")
        with torch.no_grad():
            ref = torch.softmax(hf(**ids).logits[0], -1).numpy()  # transformers pools the last token
        np.testing.assert_allclose(out.outputs.probs, ref, atol=1e-4)
    assert_engine_idle(llm)


def test_rewards_are_the_head_on_every_token(tmp_path):
    from transformers import AutoTokenizer

    hf = make_decoder_classifier(tmp_path, "qwen3", num_labels=1)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    llm = LLM(str(tmp_path), dtype="float32")
    outs = llm.reward(TEXTS, use_tqdm=False)
    for text, out in zip(TEXTS, outs):
        ref = hf_logits(hf, tok, text)[:, 0]
        np.testing.assert_allclose(out.outputs.score, ref, rtol=1e-4, atol=1e-4)
    # a one-label classifier is also a cross-encoder: its score is the sigmoid of the last token's logit
    scores = llm.score(TEXTS[0], TEXTS[1:], use_tqdm=False)
    for second, out in zip(TEXTS[1:], scores):
        last = hf_logits(hf, tok, TEXTS[0] + second)[-1, 0]  # this tokenizer's pair template concatenates
        assert abs(out.outputs.score - 1 / (1 + np.exp(-last))) < 1e-4


def make_qwen3_reranker(tmp_path):
    """A tiny causal Qwen3 (the Qwen3-Reranker form: the relevance is P("yes") against "no" at the last token)."""
    from tiny_models import make_tiny_model

    return make_tiny_model(tmp_path, "qwen3")


def reranker_overrides(tok) -> dict:
    """vLLM's hf_overrides for Qwen3-Reranker; the tiny vocabulary has no "no"/"yes", so two of its tokens
    stand for them."""
    no, yes = sorted(t for t in tok.get_vocab() if len(t) > 3 and t.isalpha())[:2]
    return {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": [no, yes],
            "is_original_qwen3_reranker": True}


def test_qwen3_reranker_form_gives_the_yes_probability(tmp_path):
    from transformers import AutoTokenizer

    hf = make_qwen3_reranker(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    overrides = reranker_overrides(tok)
    no, yes = tok.convert_tokens_to_ids(overrides["classifier_from_token"])
    llm = LLM(str(tmp_path), hf_overrides=overrides, dtype="float32")
    queries = ["<Query>: what is a fox?\n<Document>: " + t for t in TEXTS]
    outs = llm.classify(queries, use_tqdm=False)
    for text, out in zip(queries, outs):
        with torch.no_grad():
            logits = hf(torch.tensor([tok(text)["input_ids"]])).logits[0, -1]
        ref = torch.softmax(logits[[no, yes]], -1)[1].item()  # the model card's score
        assert abs(out.outputs.probs[0] - ref) < 1e-4
    prefix = "<Query>: what is a fox?\n<Document>: "
    scores = llm.score(prefix, TEXTS, use_tqdm=False)  # each pair through the tokenizer's pair encoding
    pair_ids = [tok(prefix, t)["input_ids"] for t in TEXTS]
    assert [s.prompt_token_ids for s in scores] == pair_ids
    as_ids = llm.classify(pair_ids, use_tqdm=False)
    np.testing.assert_allclose([s.outputs.score for s in scores], [o.outputs.probs[0] for o in as_ids], atol=1e-5)


def test_classifier_token_missing_from_the_vocabulary_is_a_clear_error(tmp_path):
    from transformers import AutoTokenizer

    make_qwen3_reranker(tmp_path)
    overrides = reranker_overrides(AutoTokenizer.from_pretrained(str(tmp_path)))
    overrides["classifier_from_token"] = [overrides["classifier_from_token"][0], "definitely-not-a-token"]
    with pytest.raises(ValueError, match="classifier_from_token names 'definitely-not-a-token'"):
        LLM(str(tmp_path), hf_overrides=overrides)


def test_bf16_classifier(tmp_path):
    from transformers import AutoTokenizer

    hf = make_decoder_classifier(tmp_path, "qwen3", num_labels=3)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    outs = LLM(str(tmp_path), dtype="bfloat16").classify(TEXTS, PoolingParams(activation=False), use_tqdm=False)
    for text, out in zip(TEXTS, outs):
        ref = hf_logits(hf, tok, text)[-1]
        assert np.dot(out.outputs.probs, ref) / np.linalg.norm(out.outputs.probs) / np.linalg.norm(ref) >= 0.999
