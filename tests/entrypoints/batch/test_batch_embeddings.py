"""run-batch with /v1/embeddings and /v1/score lines, on an embedding model and on a generative one: every
line answered once, OpenAI's embeddings body (and vLLM's score body) as `response.body`, the lines the
model cannot serve failing alone with a 400 error record.

Oracles: sentence-transformers on the same tiny Qwen3-Embedding-like checkpoint (cosine >= 0.99999 in
float32; Matryoshka = truncate then L2-normalise in numpy; scores = numpy cosines), its tokenizer (usage),
base64 read as little-endian float32 with numpy.
"""
import base64
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fastdeploy.entrypoints import run_batch

TESTS = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(TESTS / "pooling"), str(TESTS / "model_executor")]
from pooling_checkpoints import make_qwen3_embedding  # noqa: E402

TEXTS = ["The cat sat on the mat.", "hello", "Paris is large.", "a b c d e f"]
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-embedding")
    path, st = make_qwen3_embedding(root, matryoshka=True)
    return path, st, root / "hf"  # hf: the tiny generative Qwen3 the embedder wraps


def run(tmp_path, model, rows) -> dict:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_batch.main(["-i", str(source), "-o", str(out), "--model", str(model), "--max-model-len", "128",
                           "--no-progress"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["custom_id"] for r in records) == sorted(r["custom_id"] for r in rows)  # each once
    return {r["custom_id"]: r for r in records}


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def body_of(record) -> dict:
    assert record["error"] is None and record["response"]["status_code"] == 200, record
    return record["response"]["body"]


def test_embedding_and_score_lines_mixed_with_chat_on_an_embedding_model(tmp_path, checkpoint):
    path, st, _ = checkpoint
    rows = [
        {"custom_id": "e-list", "url": "/v1/embeddings", "body": {"model": "m", "input": TEXTS}},
        {"custom_id": "e-b64", "method": "POST", "url": "/v1/embeddings",
         "body": {"input": TEXTS[0], "encoding_format": "base64", "dimensions": 16}},
        {"custom_id": "s", "url": "/v1/score", "body": {"text_1": TEXTS[0], "text_2": TEXTS[1:]}},
        {"custom_id": "chat", "url": "/v1/chat/completions", "body": CHAT},
        {"custom_id": "comp", "url": "/v1/completions", "body": {"prompt": "hi", "max_tokens": 2}},
        {"custom_id": "e-bad", "url": "/v1/embeddings", "body": {"input": "x", "dimensions": 17}},
        {"custom_id": "e-key", "url": "/v1/embeddings", "body": {"input": "x", "stream": True}},
    ]
    records = run(tmp_path, path, rows)
    ref = st.encode(TEXTS, convert_to_numpy=True)

    listed = body_of(records["e-list"])
    assert listed["object"] == "list" and listed["model"] == "m"
    assert [d["index"] for d in listed["data"]] == list(range(len(TEXTS)))
    assert cosines([d["embedding"] for d in listed["data"]], ref).min() >= 0.99999
    tokens = sum(len(st.tokenizer(t)["input_ids"]) for t in TEXTS)
    assert listed["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}

    packed = body_of(records["e-b64"])
    assert packed["model"] == str(path)  # no model in the line: the runner's
    vector = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    expected = ref[0, :16] / np.linalg.norm(ref[0, :16])
    assert vector.shape == (16,) and np.abs(vector - expected).max() < 1e-5

    scores = body_of(records["s"])
    assert [d["object"] for d in scores["data"]] == ["score"] * 3
    assert np.abs(np.array([d["score"] for d in scores["data"]]) - cosines(ref[0], ref[1:])).max() < 1e-5

    for custom_id in ("chat", "comp"):
        error = records[custom_id]["error"]
        assert records[custom_id]["response"] is None and error["status_code"] == 400
        assert error["code"] == "unsupported_task" and "does not generate text" in error["message"]
    assert records["e-bad"]["error"]["status_code"] == 400 and "dimensions" in records["e-bad"]["error"]["message"]
    assert records["e-key"]["error"]["code"] == "unknown_parameter" and "stream" in records["e-key"]["error"]["message"]


def test_embedding_lines_fail_alone_on_a_generative_model(tmp_path, checkpoint):
    _, _, generative = checkpoint
    rows = [{"custom_id": "e", "url": "/v1/embeddings", "body": {"input": TEXTS}},
            {"custom_id": "comp", "url": "/v1/completions", "body": {"prompt": "hi", "max_tokens": 2}},
            {"custom_id": "s", "url": "/v1/score", "body": {"text_1": "a", "text_2": "b"}}]
    records = run(tmp_path, generative, rows)
    completion = body_of(records["comp"])  # its model has no chat template: a completion line
    assert completion["object"] == "text_completion" and completion["usage"]["completion_tokens"] >= 1
    for custom_id, what in (("e", "does not serve embeddings"), ("s", "does not serve scores")):
        error = records[custom_id]["error"]
        assert error["status_code"] == 400 and error["code"] == "unsupported_task" and what in error["message"]
