"""A real API server on pooling models: POST /v1/embeddings and POST /v1/score through the official
`openai` client and plain HTTP, and the errors of endpoints a model cannot answer.

Oracles: sentence-transformers on the same tiny Qwen3-Embedding-like checkpoint (embeddings, cosine
>= 0.99999 in float32; Matryoshka = its full embedding truncated then L2-normalised in numpy; a
score = the numpy cosine of its two embeddings), its tokenizer (token counts, token-id inputs),
`LLM.score` on the same cross-encoder (itself checked against transformers), OpenAI's error object
and base64 format (little-endian float32 bytes, as the client's own decoder reads them).
"""
import base64
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from running_server import RunningServer

TESTS = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(TESTS / "pooling"), str(TESTS / "model_executor")]
from pooling_checkpoints import make_decoder_classifier, make_qwen3_embedding  # noqa: E402

NAME = "emb"
TEXTS = ["The cat sat on the mat.", "hello", "Paris is the capital of France, and it is large.", "a b c d e f",
         "Embeddings map text to vectors."]
MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_qwen3_embedding(tmp_path_factory.mktemp("qwen3-embedding"), matryoshka=True)


@pytest.fixture(scope="module")
def server(checkpoint):
    path, _ = checkpoint
    with RunningServer("--model", str(path), "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8",
                       "--served-model-name", NAME, model=NAME) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return server.client(timeout=60)


def reference(checkpoint, texts) -> np.ndarray:
    return checkpoint[1].encode(list(texts), convert_to_numpy=True).astype(np.float32)


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def token_ids(checkpoint, text) -> list:
    return checkpoint[1].tokenizer(text)["input_ids"]  # with the EOS the tokenizer appends


def post(server, route, body):
    return httpx.post(server.url + route, json=body, timeout=60)


def assert_error(response, status, param):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param, error
    return error


# ---- embeddings ------------------------------------------------------------------------------------
def test_embeddings_equal_sentence_transformers(client, checkpoint):
    out = client.embeddings.create(model=NAME, input=TEXTS, encoding_format="float")
    assert out.object == "list" and out.model == NAME
    assert [d.index for d in out.data] == list(range(len(TEXTS))) and all(d.object == "embedding" for d in out.data)
    got = np.array([d.embedding for d in out.data], np.float32)
    assert cosines(got, reference(checkpoint, TEXTS)).min() >= 0.99999
    tokens = sum(len(token_ids(checkpoint, t)) for t in TEXTS)
    assert out.usage.prompt_tokens == out.usage.total_tokens == tokens


def test_base64_is_little_endian_float32(client, server):
    floats = client.embeddings.create(model=NAME, input=TEXTS[:2], encoding_format="float")
    decoded = client.embeddings.create(model=NAME, input=TEXTS[:2])  # the client asks for base64, decodes it
    assert [d.embedding for d in decoded.data] == [d.embedding for d in floats.data]
    raw = post(server, "/v1/embeddings", {"model": NAME, "input": TEXTS[:2], "encoding_format": "base64"}).json()
    for item, expected in zip(raw["data"], floats.data):
        assert isinstance(item["embedding"], str)
        vector = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        assert vector.tolist() == expected.embedding


def test_one_string_and_token_id_inputs(client, checkpoint):
    one = client.embeddings.create(model=NAME, input=TEXTS[0], encoding_format="float")
    assert len(one.data) == 1 and cosines(one.data[0].embedding, reference(checkpoint, TEXTS[:1])[0]) >= 0.99999
    ids = [token_ids(checkpoint, t) for t in TEXTS[:3]]
    out = client.embeddings.create(model=NAME, input=ids, encoding_format="float")
    assert cosines([d.embedding for d in out.data], reference(checkpoint, TEXTS[:3])).min() >= 0.99999
    assert out.usage.prompt_tokens == sum(map(len, ids))
    single = client.embeddings.create(model=NAME, input=ids[1], encoding_format="float")
    assert cosines(single.data[0].embedding, reference(checkpoint, TEXTS[1:2])[0]) >= 0.99999


def test_input_order_is_kept_under_concurrency(server, checkpoint):
    expected = dict(zip(TEXTS, reference(checkpoint, TEXTS)))
    rng = np.random.default_rng(0)
    batches = [[TEXTS[i] for i in rng.permutation(len(TEXTS))[:int(rng.integers(2, 6))]] for _ in range(12)]

    def embed(texts):
        out = server.client(timeout=60).embeddings.create(model=NAME, input=texts, encoding_format="float")
        return texts, out

    with ThreadPoolExecutor(6) as pool:
        for texts, out in pool.map(embed, batches):
            assert [d.index for d in out.data] == list(range(len(texts)))
            got = np.array([d.embedding for d in out.data])
            assert cosines(got, np.array([expected[t] for t in texts])).min() >= 0.99999


def test_matryoshka_dimensions(client, checkpoint):
    full = reference(checkpoint, TEXTS[:2])
    out = client.embeddings.create(model=NAME, input=TEXTS[:2], dimensions=32, encoding_format="float")
    truncated = full[:, :32] / np.linalg.norm(full[:, :32], axis=-1, keepdims=True)
    assert all(len(d.embedding) == 32 for d in out.data)
    assert np.abs(np.array([d.embedding for d in out.data]) - truncated).max() < 1e-5


def test_normalize_false_and_truncation(client, server, checkpoint):
    raw = post(server, "/v1/embeddings", {"model": NAME, "input": TEXTS[2], "normalize": False}).json()
    vector = np.array(raw["data"][0]["embedding"])
    assert abs(np.linalg.norm(vector) - 1.0) > 1e-3  # not normalised
    assert cosines(vector, reference(checkpoint, TEXTS[2:3])[0]) >= 0.99999
    long_text = " ".join(["word"] * 200)
    cut = post(server, "/v1/embeddings", {"model": NAME, "input": long_text, "truncate_prompt_tokens": 8}).json()
    assert cut["usage"]["prompt_tokens"] == 8
    kept = checkpoint[1].tokenizer(long_text, truncation=True, max_length=8)["input_ids"]  # its side, EOS kept
    same = client.embeddings.create(model=NAME, input=kept, encoding_format="float")
    assert cosines(cut["data"][0]["embedding"], same.data[0].embedding) >= 0.99999


# ---- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("body, param", [
    ({}, "input"), ({"input": []}, "input"), ({"input": ""}, "input"), ({"input": [1, "a"]}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"), ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "dimensions": 17}, "dimensions"), ({"input": "x", "normalize": "yes"}, "normalize"),
    ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"input": "x", "truncate_prompt_tokens": MAX_MODEL_LEN + 1}, "truncate_prompt_tokens"),
    ({"input": " ".join(["word"] * 200)}, "input"), ({"input": "x", "frobnicate": 1}, "frobnicate"),
])
def test_bad_embedding_bodies_are_400_naming_the_field(server, body, param):
    error = assert_error(post(server, "/v1/embeddings", {"model": NAME, **body}), 400, param)
    assert error["type"] == "invalid_request_error"
    assert param in error["message"] or (param == "input" and "prompt" in error["message"])


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="nope", input="x")
    assert e.value.body["param"] == "model" and NAME in e.value.message


def test_completions_on_an_embedding_model_are_400(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert e.value.body["code"] == "unsupported_task" and "does not generate text" in e.value.message
    error = assert_error(post(server, "/v1/completions", {"model": NAME, "prompt": "hi"}), 400, None)
    assert "/v1/embeddings" in error["message"]


# ---- score -----------------------------------------------------------------------------------------
def test_score_is_the_cosine_of_the_embeddings(server, checkpoint):
    query, docs = TEXTS[0], TEXTS[1:]
    body = post(server, "/v1/score", {"model": NAME, "text_1": query, "text_2": docs}).json()
    assert body["object"] == "list" and body["model"] == NAME and body["id"].startswith("score-")
    assert [d["index"] for d in body["data"]] == list(range(len(docs)))
    assert all(d["object"] == "score" for d in body["data"])
    ref = reference(checkpoint, TEXTS)
    assert np.abs(np.array([d["score"] for d in body["data"]]) - cosines(ref[0], ref[1:])).max() < 1e-5
    assert body["usage"]["prompt_tokens"] == sum(len(token_ids(checkpoint, t)) for t in TEXTS)  # each text once
    pairwise = post(server, "/v1/score", {"text_1": TEXTS[:2], "text_2": TEXTS[2:4]}).json()
    assert np.abs(np.array([d["score"] for d in pairwise["data"]]) - cosines(ref[:2], ref[2:4])).max() < 1e-5


@pytest.mark.parametrize("body, param", [({"text_1": "a"}, "text_2"), ({"text_1": ["a", "b"], "text_2": ["c"] * 3},
                                                                       "text_1"),
                                         ({"text_1": 3, "text_2": "b"}, "text_1"), ({"text_1": "a", "text_2": []},
                                                                                     "text_2")])
def test_bad_score_bodies_are_400(server, body, param):
    assert_error(post(server, "/v1/score", body), 400, param)


# ---- metrics and models ----------------------------------------------------------------------------
def scrape(server) -> dict:
    text = httpx.get(server.url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_embedding_inputs(client, server):
    before = scrape(server)
    out = client.embeddings.create(model=NAME, input=TEXTS, encoding_format="float")
    after = scrape(server)
    tokens = ("fastdeploy:prompt_tokens_total", ())
    success = ("fastdeploy:request_success_total", (("finished_reason", "stop"),))
    assert after[tokens] - before.get(tokens, 0.0) == out.usage.prompt_tokens
    assert after[success] - before.get(success, 0.0) == len(TEXTS)
    assert after[("fastdeploy:generation_tokens_total", ())] == before.get(("fastdeploy:generation_tokens_total", ()),
                                                                           0.0)


def test_models_is_unchanged(client):
    assert [m.id for m in client.models.list().data] == [NAME]


# ---- a cross-encoder ---------------------------------------------------------------------------------
def test_cross_encoder_scores_equal_llm_score(tmp_path):
    from fastdeploy import LLM

    path = tmp_path / "ce"
    make_decoder_classifier(path, "qwen3", num_labels=1)
    query, docs = "what is a cat", ["a cat is an animal", "the stock market fell", "cats purr"]
    llm = LLM(str(path), task="score", max_model_len=MAX_MODEL_LEN)
    expected = [o.outputs.score for o in llm.score(query, docs, use_tqdm=False)]
    llm.shutdown()
    with RunningServer("--model", str(path), "--task", "score", "--max-model-len", str(MAX_MODEL_LEN),
                       "--served-model-name", "ce", model="ce") as s:
        body = post(s, "/v1/score", {"model": "ce", "text_1": query, "text_2": docs}).json()
        assert np.abs(np.array([d["score"] for d in body["data"]]) - expected).max() < 1e-5
        error = assert_error(post(s, "/v1/embeddings", {"input": "x"}), 400, None)
        assert "does not serve embeddings" in error["message"] and error["code"] == "unsupported_task"
