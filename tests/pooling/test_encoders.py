"""BERT and XLM-RoBERTa end to end against the oracles: sentence-transformers' embeddings (CLS and mean
pooling, Normalize), its CrossEncoder's scores, transformers' classification probabilities; float32 and
bf16; the default max_model_len of a 512-position encoder; texts longer than it."""
import numpy as np
import pytest

from fastdeploy import LLM, PoolingParams
from encoder_checkpoints import MAX_POSITIONS, make_encoder, make_sentence_encoder
from helpers import assert_engine_idle

TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world", "what is the capital of china?",
         " ".join(["machine learning is fascinating"] * 20), "a"]
PAIRS = [("what is the capital of china", "paris france"), ("hello", "hello world"),
         ("the quick brown fox", "the lazy dog is not quick"), ("search query", "relevant passage " * 10)]


def cosines(ours, ref):
    ours, ref = np.asarray(ours, np.float64), ref.astype(np.float64)
    return (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)


@pytest.fixture(scope="module", params=[("bert", "cls"), ("bert", "mean"), ("xlmr", "cls")],
                ids=lambda p: "-".join(p))
def sentence_encoder(request, tmp_path_factory):
    family, mode = request.param
    return make_sentence_encoder(tmp_path_factory.mktemp(f"{family}_{mode}"), family, mode)


def test_embeddings_equal_sentence_transformers(sentence_encoder):
    path, st = sentence_encoder
    ref = st.encode(TEXTS, convert_to_numpy=True)
    llm = LLM(str(path), task="embed", dtype="float32")  # no max_model_len: the encoder's 512
    assert llm.llm_engine.config.scheduler_config.max_model_len == MAX_POSITIONS
    outs = llm.embed(TEXTS, use_tqdm=False)
    assert np.all(cosines([o.outputs.embedding for o in outs], ref) >= 0.99999)
    assert outs[0].prompt_token_ids == st.tokenizer(TEXTS[0])["input_ids"]  # [CLS] ... [SEP] / <s> ... </s>
    assert_engine_idle(llm)


def test_embeddings_in_bf16(sentence_encoder):
    path, st = sentence_encoder
    ref = st.encode(TEXTS, convert_to_numpy=True)
    llm = LLM(str(path), dtype="bfloat16")
    assert np.all(cosines([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)], ref) >= 0.999)


def test_a_text_past_max_model_len_is_refused_or_truncated_as_sentence_transformers_does(sentence_encoder):
    path, st = sentence_encoder
    long_text = "the quick brown fox " * 200  # ~800 tokens
    llm = LLM(str(path), dtype="float32")
    with pytest.raises(ValueError, match=r"prompt 0 has \d+ tokens, above max_model_len=512"):
        llm.embed([long_text])
    ref = st.encode([long_text], convert_to_numpy=True)  # sentence-transformers cuts at max_seq_length 512
    out = llm.embed([long_text], truncate_prompt_tokens=-1, use_tqdm=False)[0]
    assert len(out.prompt_token_ids) == MAX_POSITIONS
    assert cosines([out.outputs.embedding], ref)[0] >= 0.99999
    assert_engine_idle(llm)


@pytest.mark.parametrize("family", ["bert", "xlmr"])
def test_cross_encoder_scores_equal_sentence_transformers(tmp_path, family):
    from sentence_transformers import CrossEncoder

    make_encoder(tmp_path, family, num_labels=1)
    ref = CrossEncoder(str(tmp_path), device="cpu").predict(PAIRS)
    llm = LLM(str(tmp_path), dtype="float32")
    assert llm.llm_engine.config.pooling_task == "classify"
    outs = llm.score([a for a, _ in PAIRS], [b for _, b in PAIRS], use_tqdm=False)
    np.testing.assert_allclose([o.outputs.score for o in outs], ref, atol=1e-5)
    one_to_many = llm.score(PAIRS[0][0], [b for _, b in PAIRS], use_tqdm=False)  # 1 -> N
    ref_1n = CrossEncoder(str(tmp_path), device="cpu").predict([(PAIRS[0][0], b) for _, b in PAIRS])
    np.testing.assert_allclose([o.outputs.score for o in one_to_many], ref_1n, atol=1e-5)
    logits = llm.score(PAIRS[0][0], PAIRS[0][1], PoolingParams(activation=False), use_tqdm=False)[0].outputs.score
    assert abs(1 / (1 + np.exp(-logits)) - ref[0]) < 1e-5
    assert_engine_idle(llm)


@pytest.mark.parametrize("family", ["bert", "xlmr"])
def test_classification_probabilities_equal_transformers(tmp_path, family):
    import torch
    from transformers import AutoTokenizer

    hf = make_encoder(tmp_path, family, num_labels=3)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    llm = LLM(str(tmp_path), dtype="float32")
    outs = llm.classify(TEXTS, use_tqdm=False)
    for text, out in zip(TEXTS, outs):
        with torch.no_grad():
            logits = hf(**tok(text, return_tensors="pt")).logits[0]
        np.testing.assert_allclose(out.outputs.probs, torch.softmax(logits, -1).numpy(), atol=1e-4)
        assert out.outputs.num_classes == 3
    raw = llm.classify(TEXTS[:1], PoolingParams(activation=False), use_tqdm=False)[0].outputs.probs
    with torch.no_grad():
        np.testing.assert_allclose(raw, hf(**tok(TEXTS[0], return_tensors="pt")).logits[0].numpy(), atol=1e-4)


def test_bf16_checkpoint_of_a_cross_encoder(tmp_path):
    from sentence_transformers import CrossEncoder

    make_encoder(tmp_path, "xlmr", num_labels=1, dtype="bfloat16")
    ref = CrossEncoder(str(tmp_path), device="cpu", model_kwargs={"dtype": "float32"}).predict(PAIRS)
    outs = LLM(str(tmp_path), dtype="float32").score([a for a, _ in PAIRS], [b for _, b in PAIRS], use_tqdm=False)
    np.testing.assert_allclose([o.outputs.score for o in outs], ref, atol=1e-4)


def test_embeddings_in_wint8(sentence_encoder):
    path, st = sentence_encoder
    ref = st.encode(TEXTS, convert_to_numpy=True)
    outs = LLM(str(path), quantization="wint8").embed(TEXTS, use_tqdm=False)
    assert np.all(cosines([o.outputs.embedding for o in outs], ref) >= 0.995)
