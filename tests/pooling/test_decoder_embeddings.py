"""Decoder embedders (Qwen3-Embedding's form) against sentence-transformers on the same tiny checkpoint:
last-token pooling over the EOS the tokenizer appends, L2-normalised, both modules.json layouts,
float32 and bf16, Matryoshka truncation, and the pooling types read from the pipeline."""
import numpy as np
import pytest

from fastdeploy import LLM, PoolingParams
from helpers import assert_engine_idle
from pooling_checkpoints import make_qwen3_embedding

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello world!", "你好，世界。 def f(x): return x + 1",
         "fox " * 40, "a"]
QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages\nQuery: "


def cosines(ours: list, ref: np.ndarray) -> np.ndarray:
    ours = np.asarray(ours, dtype=np.float64)
    ref = ref.astype(np.float64)
    return (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)


@pytest.fixture(scope="module", params=["new_layout", "hub_layout"])
def qwen3_embedding(request, tmp_path_factory):
    path, st = make_qwen3_embedding(tmp_path_factory.mktemp("qwen3_embedding"),
                                    legacy_layout=request.param == "hub_layout")
    return path, st


def test_embeddings_equal_sentence_transformers_float32(qwen3_embedding):
    path, st = qwen3_embedding
    ref = st.encode(TEXTS, convert_to_numpy=True)
    llm = LLM(str(path), dtype="float32")
    outs = llm.embed(TEXTS, use_tqdm=False)
    assert [type(o).__name__ for o in outs] == ["EmbeddingRequestOutput"] * len(TEXTS)
    assert np.all(cosines([o.outputs.embedding for o in outs], ref) >= 0.99999)
    norms = [np.linalg.norm(o.outputs.embedding) for o in outs]
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)
    eos = llm.get_tokenizer().convert_tokens_to_ids("<|endoftext|>")
    assert all(o.prompt_token_ids[-1] == eos for o in outs)  # the tokenizer's special tokens are added
    # instruction-prefixed queries, as Qwen3-Embedding is used: the prefix is part of the text
    query = ["What is the capital of China?"]
    ref_q = st.encode([QUERY_PROMPT + query[0]], convert_to_numpy=True)
    assert cosines([llm.embed([QUERY_PROMPT + query[0]], use_tqdm=False)[0].outputs.embedding], ref_q)[0] >= 0.99999
    assert_engine_idle(llm)


def test_embeddings_in_bf16(qwen3_embedding):
    path, st = qwen3_embedding
    ref = st.encode(TEXTS, convert_to_numpy=True)
    llm = LLM(str(path), dtype="bfloat16")
    outs = llm.embed(TEXTS, use_tqdm=False)
    assert np.all(cosines([o.outputs.embedding for o in outs], ref) >= 0.999)


def test_encode_gives_the_models_task_and_the_seed_example_works(qwen3_embedding):
    path, _ = qwen3_embedding
    llm = LLM(str(path), task="embed", dtype="float32")
    outputs = llm.encode(["Hello, world!", "How are you?", "Machine learning is fascinating."])
    for output in outputs:  # the vLLM seed's loop
        embedding = output.outputs.embedding
        assert len(embedding) == 64
    alone = llm.embed(["Hello, world!"], use_tqdm=False)[0].outputs.data  # another batch: float rounding only
    np.testing.assert_allclose(outputs[0].outputs.data, alone, rtol=1e-5, atol=1e-6)


def test_unnormalized_embedding_is_the_last_hidden_state(qwen3_embedding):
    import torch
    from transformers import AutoModel

    path, st = qwen3_embedding
    hf = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    ids = st.tokenizer(TEXTS[0])["input_ids"]
    with torch.no_grad():
        last = hf(torch.tensor([ids])).last_hidden_state[0, -1].numpy()
    llm = LLM(str(path), dtype="float32")
    out = llm.embed(TEXTS[0], PoolingParams(normalize=False), use_tqdm=False)[0].outputs.data
    np.testing.assert_allclose(out, last, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def matryoshka(tmp_path_factory):
    return make_qwen3_embedding(tmp_path_factory.mktemp("matryoshka"), matryoshka=True)


@pytest.mark.parametrize("dims", [16, 32])
def test_matryoshka_truncation_is_truncate_then_normalise(matryoshka, dims):
    path, st = matryoshka
    full = st.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=False)
    ref = full[:, :dims] / np.linalg.norm(full[:, :dims], axis=1, keepdims=True)
    llm = LLM(str(path), dtype="float32")
    outs = llm.embed(TEXTS, PoolingParams(dimensions=dims), use_tqdm=False)
    assert all(len(o.outputs.embedding) == dims for o in outs)
    assert np.all(cosines([o.outputs.embedding for o in outs], ref) >= 0.99999)
    np.testing.assert_allclose([np.linalg.norm(o.outputs.embedding) for o in outs], 1.0, atol=1e-5)
    with pytest.raises(ValueError, match=r"dimensions=24: this model supports the Matryoshka dimensions \[16, 32, 64\]"):
        llm.embed(TEXTS, PoolingParams(dimensions=24))


def test_dimensions_on_a_model_without_matryoshka_is_refused(qwen3_embedding):
    path, _ = qwen3_embedding
    llm = LLM(str(path), dtype="float32")
    with pytest.raises(ValueError, match="does not declare Matryoshka support"):
        llm.embed(TEXTS, PoolingParams(dimensions=16))


@pytest.mark.parametrize("mode", ["mean", "cls"])
def test_pooling_mode_is_read_from_the_pipeline(tmp_path, mode):
    path, st = make_qwen3_embedding(tmp_path, pooling_mode=mode, legacy_layout=mode == "cls")
    llm = LLM(str(path), dtype="float32")
    assert llm.llm_engine.config.pooler_config.pooling_type == {"mean": "MEAN", "cls": "CLS"}[mode]
    ref = st.encode(TEXTS, convert_to_numpy=True)
    assert np.all(cosines([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)], ref) >= 0.99999)


def test_pooler_config_overrides_the_pipeline(qwen3_embedding):
    path, st = qwen3_embedding
    llm = LLM(str(path), dtype="float32", pooler_config={"pooling_type": "MEAN", "normalize": False})
    ids = st.tokenizer(TEXTS[0])["input_ids"]
    import torch
    from transformers import AutoModel

    hf = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        mean = hf(torch.tensor([ids])).last_hidden_state[0].mean(0).numpy()
    np.testing.assert_allclose(llm.embed(TEXTS[0], use_tqdm=False)[0].outputs.data, mean, rtol=1e-4, atol=1e-4)
