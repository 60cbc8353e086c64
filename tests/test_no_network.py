"""No network, ever: with every way to open a connection or resolve a name blocked (each raises an
error naming the call, and every attempt is counted), the whole public API runs on the default
model: a fresh LLM(...), generate (text, ids, dicts), chat with chat_template_kwargs, n > 1,
logprobs, prompt_logprobs, stop, reset_prefix_cache, get_tokenizer, and run-batch in process.
A model name that is not on this machine fails fast with FileNotFoundError, and tries no socket."""
import json
import socket
import time

import pytest

from fastdeploy import LLM, SamplingParams
from helpers import SMOLLM_BLOCK_SIZE, assert_engine_idle


class NetworkBlocked(OSError):
    pass


@pytest.fixture(scope="module")
def attempts():
    """Blocks the network for the module's tests; the list of calls tried (each also raised)."""
    tried = []

    def blocked(name):
        def refuse(*args, **kwargs):
            tried.append((name, args[1:] if name.startswith("socket.socket.") else args))
            raise NetworkBlocked(f"network access attempted in a no-network test: {name}{args!r}")
        return refuse

    with pytest.MonkeyPatch.context() as mp:
        for name in ("connect", "connect_ex", "sendto"):
            mp.setattr(socket.socket, name, blocked(f"socket.socket.{name}"))
        for name in ("create_connection", "getaddrinfo", "gethostbyname", "gethostbyname_ex"):
            mp.setattr(socket, name, blocked(f"socket.{name}"))
        yield tried


@pytest.fixture(scope="module")
def offline_llm(attempts, smollm_path):
    """A fresh LLM built while the network is blocked."""
    llm = LLM(model=smollm_path, max_model_len=512, block_size=SMOLLM_BLOCK_SIZE, max_num_seqs=4)
    assert attempts == []
    return llm


def test_the_block_catches_a_connection(attempts):
    with pytest.raises(NetworkBlocked, match="socket.create_connection"):
        socket.create_connection(("example.com", 80), timeout=1)
    with pytest.raises(NetworkBlocked, match="socket.getaddrinfo"):
        socket.getaddrinfo("example.com", 443)
    with socket.socket() as s, pytest.raises(NetworkBlocked, match="socket.socket.connect"):
        s.connect(("127.0.0.1", 9))
    assert [name for name, _ in attempts] == ["socket.create_connection", "socket.getaddrinfo",
                                              "socket.socket.connect"]
    attempts.clear()


def test_public_api_runs_without_network(offline_llm, attempts):
    llm = offline_llm
    greedy = SamplingParams(temperature=0, max_tokens=4)
    tok = llm.get_tokenizer()
    ids = tok.encode("The capital of France is", add_special_tokens=False)

    by_text = llm.generate("The capital of France is", greedy, use_tqdm=False)[0]
    by_ids = llm.generate(ids, greedy, use_tqdm=False)[0]
    by_dicts = llm.generate([{"prompt": "The capital of France is"}, {"prompt_token_ids": ids}], greedy,
                            use_tqdm=False)
    assert by_text.prompt_token_ids == ids and len(by_text.outputs.token_ids) >= 1
    assert by_ids.outputs.token_ids == by_text.outputs.token_ids
    assert [o.outputs.token_ids for o in by_dicts] == [by_text.outputs.token_ids] * 2

    chat = llm.chat([{"role": "user", "content": "Say OK."}], greedy, use_tqdm=False,
                    chat_template_kwargs={"enable_thinking": False})[0]
    assert "<|im_start|>assistant" in chat.prompt and len(chat.outputs.token_ids) >= 1

    sampled = llm.generate("Once upon a time", SamplingParams(n=3, temperature=0.8, seed=7, max_tokens=4),
                           use_tqdm=False)[0]
    assert len(sampled.outputs) == 3 and all(len(c.token_ids) >= 1 for c in sampled.outputs)

    scored = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=3, logprobs=2,
                                                              prompt_logprobs=1), use_tqdm=False)[0]
    assert len(scored.outputs.logprobs) == len(scored.outputs.token_ids)
    assert scored.prompt_logprobs[0] is None and len(scored.prompt_logprobs) == len(scored.prompt_token_ids)

    story = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                         use_tqdm=False)[0].outputs
    stop = story.text.strip().split()[0]  # a word the run generates: it must stop there
    stopped = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=12, stop=[stop]),
                           use_tqdm=False)[0].outputs
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop and stop not in stopped.text

    assert llm.reset_prefix_cache() is True
    again = llm.generate("The capital of France is", greedy, use_tqdm=False)[0]
    assert again.outputs.token_ids == by_text.outputs.token_ids
    assert_engine_idle(llm)
    assert attempts == [], f"network calls attempted: {attempts}"


def test_run_batch_in_process_without_network(tmp_path, attempts, smollm_path):
    from fastdeploy.entrypoints.batch.runner import run_job

    rows = [
        {"custom_id": "c0", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}},
        {"custom_id": "q0", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 4, "temperature": 0,
                  "chat_template_kwargs": {"enable_thinking": False}}},
    ]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    summary = run_job(str(inp), str(out), {"model": smollm_path, "max_model_len": 512, "max_num_seqs": 4,
                                           "block_size": SMOLLM_BLOCK_SIZE}, use_tqdm=False)
    assert (summary.done, summary.failed) == (2, 0), summary.failures
    records = {r["custom_id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    assert set(records) == {"c0", "q0"}
    assert all(r["error"] is None and r["response"]["status_code"] == 200 for r in records.values())
    assert attempts == [], f"network calls attempted: {attempts}"


def test_a_model_that_is_not_local_fails_fast_without_a_socket(tmp_path, monkeypatch, attempts):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache: nothing to find there
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError) as info:
        LLM(model="someorg/not-a-local-model")
    elapsed = time.perf_counter() - start
    assert str(info.value) == (
        f"model 'someorg/not-a-local-model' is not a local directory or file, and is not in the local Hugging "
        f"Face cache ({tmp_path / 'hub'}). This engine does not download models: download it elsewhere and pass "
        "its local path."
    )
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert attempts == [], f"network calls attempted: {attempts}"
