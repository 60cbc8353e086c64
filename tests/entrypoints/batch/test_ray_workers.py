"""Data-parallel batch workers on a local Ray instance (2 CPUs), on the default model.

RayWorkers must give, per custom_id, the same greedy text as one LocalWorker; a killed actor must
end `process` with RuntimeError naming it, within a bounded time; LLMPredictor in a Ray Data
pipeline must give LLM.generate's greedy text. Every test holds at most 2 one-CPU actors and frees
them before it ends (the instance has 2 CPUs). The reference runs in this process.
"""
import json
import sys
import time

import fastdeploy  # noqa: F401  (first: sets the MKL fix before paddle is imported)
import pytest
import ray

from fastdeploy import SamplingParams
from fastdeploy.entrypoints.batch import ray_workers
from fastdeploy.entrypoints.batch.format import parse_request_line
from fastdeploy.entrypoints.batch.local_worker import LocalWorker
from fastdeploy.entrypoints.batch.ray_data import LLMPredictor
from fastdeploy.entrypoints.batch.ray_workers import RayWorkers
from fastdeploy.entrypoints.batch.runner import run_job

HANG_LIMIT_S = 240  # no_hang's limit per test (model loads on 2 shared cores)
ENGINE_KWARGS = {"model": None, "max_model_len": 512, "max_num_seqs": 4}
MAX_TOKENS = 12
PROMPTS = ["Once upon a time", "The capital of France is", "1, 2, 3, 4,", "def add(a, b):",
           "The sky is", "Water boils at"]
QUESTIONS = ["Say OK.", "Name a fruit.", "Name a color.", "What is 2 + 2?", "Reply yes or no.", "Hi!"]


def greedy() -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=MAX_TOKENS)


def input_lines() -> list[str]:
    """12 OpenAI batch request lines, chat and completion interleaved, greedy."""
    out = []
    for i, (prompt, question) in enumerate(zip(PROMPTS, QUESTIONS)):
        out.append({"custom_id": f"cmpl-{i}", "url": "/v1/completions",
                    "body": {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}})
        out.append({"custom_id": f"chat-{i}", "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "user", "content": question}], "max_tokens": MAX_TOKENS,
                             "temperature": 0}})
    return [json.dumps(line) for line in out]


def batch_requests() -> list:
    return [parse_request_line(text, number) for number, text in enumerate(input_lines(), 1)]


def text_of(record: dict) -> str:
    """The generated text of one successful OpenAI batch output record."""
    assert record.get("error") is None, record
    response = record["response"]
    assert response["status_code"] == 200, record
    choice = response["body"]["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def texts(records: dict) -> dict:
    return {custom_id: text_of(r) for custom_id, r in records.items()}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def reference():
    """custom_id -> output record, from one LocalWorker in this process."""
    worker = LocalWorker(dict(ENGINE_KWARGS))
    try:
        return {r["custom_id"]: r for r in worker.process(batch_requests())}
    finally:
        worker.shutdown()


def test_two_actors_match_one_local_worker(local_ray, reference, no_hang, monkeypatch):
    monkeypatch.setattr(ray_workers, "CHUNK_SIZE", 4)  # 3 chunks over 2 actors: both work, one twice
    workers = RayWorkers(dict(ENGINE_KWARGS), data_parallel_size=2)
    try:
        assert workers.cpus_per_actor == 1
        infos = workers.actor_info
        assert len({i["pid"] for i in infos}) == 2
        assert all(i["omp_num_threads"] == "1" and i["engine_threads"] == 1 for i in infos), infos
        records = list(workers.process(batch_requests()))
    finally:
        workers.shutdown()
    ids = [r["custom_id"] for r in records]
    assert sorted(ids) == sorted(reference) and len(ids) == len(set(ids)) == 12
    assert {r["custom_id"]: text_of(r) for r in records} == texts(reference)
    assert ray.is_initialized(), "shutdown must not stop a Ray instance it did not start"


def test_killed_actor_raises_naming_it(local_ray, no_hang, monkeypatch):
    monkeypatch.setattr(ray_workers, "CHUNK_SIZE", 1)  # 12 chunks: the killed actor always has more to do
    workers = RayWorkers(dict(ENGINE_KWARGS), data_parallel_size=2)
    try:
        stream = workers.process(batch_requests())
        first = next(stream)
        assert text_of(first)
        ray.kill(workers._actors[0], no_restart=True)
        killed_at = time.monotonic()
        with pytest.raises(RuntimeError, match=workers.names[0]) as info:
            for _ in stream:
                pass
        assert time.monotonic() - killed_at < 60
        assert "died" in str(info.value)
    finally:
        workers.shutdown()


def test_ray_data_predictor_matches_generate(local_ray, no_hang):
    prompts = PROMPTS + ["Apples are", "My name is"]
    from fastdeploy import LLM

    llm = LLM(**ENGINE_KWARGS)
    expected = [o.outputs.text for o in llm.generate(prompts, greedy(), use_tqdm=False)]
    del llm
    ds = ray.data.from_items([{"prompt": p} for p in prompts])
    out = ds.map_batches(
        LLMPredictor,
        fn_constructor_kwargs={"sampling_params": {"temperature": 0, "max_tokens": MAX_TOKENS}, **ENGINE_KWARGS},
        concurrency=2, batch_size=4, num_cpus=1,
    ).take_all()
    got = {row["prompt"]: (row["generated_text"], row["num_generated_tokens"]) for row in out}
    assert sorted(got) == sorted(prompts)
    assert [got[p][0] for p in prompts] == expected
    assert all(0 < got[p][1] <= MAX_TOKENS for p in prompts)


def test_ray_data_predictor_messages_column(local_ray, reference, no_hang):
    """Conversations stored by Ray Data (Arrow list of structs) come back as the chat answers;
    the second row's messages lack the key "name" that the first row has (None after Arrow)."""
    rows = [{"messages": [{"role": "user", "content": QUESTIONS[0], "name": "a"}]},
            {"messages": [{"role": "user", "content": QUESTIONS[1]}]}]
    out = ray.data.from_items(rows).map_batches(
        LLMPredictor, fn_constructor_kwargs={"sampling_params": greedy(), **ENGINE_KWARGS},
        concurrency=1, batch_size=2, num_cpus=1,
    ).take_all()
    assert len(out) == 2
    by_question = {row["messages"][0]["content"]: row["generated_text"] for row in out}
    assert by_question == {QUESTIONS[0]: text_of(reference["chat-0"]), QUESTIONS[1]: text_of(reference["chat-1"])}


def test_run_job_on_ray_resumes(local_ray, reference, no_hang, tmp_path, monkeypatch):
    """run_job with data_parallel_size 2 on an output file that already answers 3 requests (as a
    crashed run leaves it): those are skipped, the other 9 are appended, each custom_id once."""
    monkeypatch.setattr(ray_workers, "CHUNK_SIZE", 3)
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(input_lines()) + "\n")
    done_before = ["cmpl-0", "chat-3", "cmpl-5"]
    target.write_text("".join(json.dumps(reference[c]) + "\n" for c in done_before))
    summary = run_job(str(source), str(target), dict(ENGINE_KWARGS), data_parallel_size=2, use_tqdm=False)
    assert (summary.skipped, summary.done, summary.failed) == (3, 9, 0)
    records = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r["custom_id"] for r in records[:3]] == done_before
    assert sorted(r["custom_id"] for r in records) == sorted(reference)
    assert {r["custom_id"]: text_of(r) for r in records} == texts(reference)
    assert ray.is_initialized()


def test_bad_settings_fail_before_actors_start(local_ray, no_hang):
    with pytest.raises(ValueError, match="max_model_len"):
        RayWorkers({**ENGINE_KWARGS, "max_model_len": 0}, data_parallel_size=2)
    with pytest.raises(ValueError, match="3 needs one Ray CPU per actor, the Ray cluster has 2"):
        RayWorkers(dict(ENGINE_KWARGS), data_parallel_size=3)
    with pytest.raises(ValueError, match="data_parallel_size must be an int >= 1"):
        RayWorkers(dict(ENGINE_KWARGS), data_parallel_size=0)


def test_actor_that_cannot_load_raises_naming_it(local_ray, no_hang, tmp_path):
    missing = str(tmp_path / "no-such-model.gguf")
    rank_0_died = r"fastdeploy-batch-\w+-0 \(data-parallel rank 0 of 2\) died while starting"
    with pytest.raises(RuntimeError, match=rank_0_died):
        RayWorkers({**ENGINE_KWARGS, "model": missing}, data_parallel_size=2)
    deadline = time.monotonic() + 30  # the killed actors give their CPUs back
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2


def test_missing_ray_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(ImportError, match=r'pip install "fastdeploy\[ray\]"'):
        RayWorkers(dict(ENGINE_KWARGS), data_parallel_size=2)
