"""run-batch end to end on the default model: a job killed by SIGKILL and run again answers every
custom_id exactly once with the greedy answers of LLM.chat / LLM.generate; bad lines become error
records; duplicate custom_ids stop the job before any work; the example file and the console command."""
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fastdeploy import SamplingParams

REPO = Path(__file__).resolve().parents[3]
ENGINE_FLAGS = ["--max-model-len", "512", "--max-num-seqs", "8", "--block-size", "16"]
QUESTIONS = ["What is the capital of France?", "Name a prime number.", "Why is the sky blue?",
             "What do bees eat?", "How far is the Moon?", "What is gravity?", "Write a haiku.",
             "What is a CPU?", "Suggest a name for a cat.", "How is glass made?"]
STARTS = ["Once upon a time", "The best way to learn", "In the year 2050,", "My favourite food is",
          "The ocean is", "A computer program"]


def requests(n: int) -> list[dict]:
    """n greedy requests, chat and completion mixed, 6-14 new tokens each."""
    rows = []
    for i in range(n):
        body = {"max_tokens": 6 + i % 9, "temperature": 0}
        if i % 3 == 2:
            rows.append({"custom_id": f"c{i}", "url": "/v1/completions",
                         "body": {**body, "prompt": f"{STARTS[i % len(STARTS)]} (#{i})"}})
        else:
            content = f"{QUESTIONS[i % len(QUESTIONS)]} (#{i})"
            rows.append({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {**body, "messages": [{"role": "user", "content": content}]}})
    return rows


def write_jsonl(path: Path, rows) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")


def command(inp: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fastdeploy.entrypoints.run_batch", "-i", str(inp), "-o", str(out),
            "--no-progress", *ENGINE_FLAGS, *extra]


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def answer_text(record: dict) -> str:
    choice = record["response"]["body"]["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def expected_texts(llm, rows: list[dict]) -> dict[str, str]:
    """The same requests through LLM.chat / LLM.generate (the oracle of the answers)."""
    texts = {}
    for row in rows:
        body = row["body"]
        params = SamplingParams(temperature=0, max_tokens=body["max_tokens"])
        if "messages" in body:
            out = llm.chat(body["messages"], params, use_tqdm=False)[0]
        else:
            out = llm.generate(body["prompt"], params, use_tqdm=False)[0]
        texts[row["custom_id"]] = out.outputs.text
    return texts


def test_job_killed_at_a_random_point_resumes_and_answers_every_request_once(tmp_path, smollm_llm):
    rows = requests(30)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(inp, rows)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    proc = subprocess.Popen(command(inp, out), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    target = rng.randint(1, 20)  # kill once this many answers are written (a random point of the run)
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= target:
            break
        time.sleep(0.05)
    time.sleep(rng.random() * 0.3)
    proc.kill()  # SIGKILL: no cleanup runs
    proc.wait(timeout=30)
    written = [json.loads(line) for line in out.read_bytes().split(b"\n")[:-1]]  # whole lines only
    assert 1 <= len(written) < len(rows), f"seed {seed}: the kill was meant to land mid-run ({len(written)} written)"
    unanswered = sorted({r["custom_id"] for r in rows} - {r["custom_id"] for r in written})
    with open(out, "ab") as f:  # as if the crash had torn a write: half a record, no newline
        f.write(b'{"id": "batch_req_torn", "custom_id": "' + unanswered[0].encode() + b'", "respo')
    done = subprocess.run(command(inp, out), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{len(written)} skipped as already answered" in done.stderr
    records = read_records(out)  # every line is whole JSON again
    ids = [r["custom_id"] for r in records]
    assert sorted(ids) == sorted(r["custom_id"] for r in rows) and len(ids) == len(set(ids)), f"seed {seed}"
    assert all(r["error"] is None and r["response"]["status_code"] == 200 for r in records)
    expected = expected_texts(smollm_llm, rows)
    for record in records:
        assert answer_text(record) == expected[record["custom_id"]], f"seed {seed}: {record['custom_id']}"


def test_bad_lines_become_error_records_and_the_job_goes_on(tmp_path):
    from fastdeploy.entrypoints.batch.runner import run_job

    good = requests(2)
    long_prompt = {"custom_id": "too-long", "url": "/v1/completions",
                   "body": {"prompt": list(range(100, 700)), "max_tokens": 4}}  # 600 tokens > max_model_len 512
    rows = [good[0], "{not json", {"custom_id": "odd", "url": "/v1/completions", "body": {"prompt": "x", "colour": 1}},
            {"custom_id": "cold", "url": "/v1/completions", "body": {"prompt": "x", "temperature": -1}},
            long_prompt, "", good[1]]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(inp, rows)
    summary = run_job(str(inp), str(out), {"model": None, "max_model_len": 512, "max_num_seqs": 4, "block_size": 16},
                      use_tqdm=False)
    assert (summary.done, summary.failed, summary.skipped) == (2, 4, 0)
    by_id = {r["custom_id"]: r for r in read_records(out) if r["custom_id"] is not None}
    errors = [r for r in read_records(out) if r["error"] is not None]
    assert {e["error"]["line"] for e in errors} == {2, 3, 4, 5}
    not_json = next(e for e in errors if e["custom_id"] is None)
    assert not_json["error"]["line"] == 2 and not_json["response"] is None
    assert "colour" in by_id["odd"]["error"]["message"]
    assert "temperature" in by_id["cold"]["error"]["message"]
    assert "max_model_len" in by_id["too-long"]["error"]["message"]
    assert by_id["q0"]["error"] is None and by_id["q1"]["error"] is None
    again = run_job(str(inp), str(out), {"model": None, "max_model_len": 512}, use_tqdm=False)
    assert (again.done, again.failed, again.skipped) == (0, 0, 6)  # all answered: nothing loads, nothing repeats


def test_duplicate_custom_ids_stop_the_job_before_any_work(tmp_path):
    rows = requests(3)
    rows[2]["custom_id"] = rows[0]["custom_id"]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(inp, rows)
    start = time.perf_counter()
    done = subprocess.run(command(inp, out), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"custom_id {rows[0]['custom_id']!r} appears on lines 1 and 3" in done.stderr
    assert not out.exists(), "no output may be written before the input is known to be usable"
    assert "loaded" not in done.stderr and time.perf_counter() - start < 60  # no model was loaded


def test_the_example_batch_file_through_the_console_command(tmp_path):
    exe = shutil.which("fastdeploy")
    assert exe is not None, "the `fastdeploy` console command is not installed: pip install -e . declares it"
    out = tmp_path / "out.jsonl"
    done = subprocess.run([exe, "run-batch", "-i", str(REPO / "examples" / "batch_requests.jsonl"), "-o", str(out),
                           "--no-progress", *ENGINE_FLAGS], capture_output=True, text=True, timeout=600,
                          env={**os.environ})
    assert done.returncode == 0, done.stderr[-2000:]
    records = {r["custom_id"]: r for r in read_records(out)}
    assert sorted(records) == ["chat-1", "chat-2", "chat-3", "completion-1", "completion-2"]
    assert all(r["response"]["status_code"] == 200 for r in records.values())
    assert len(records["chat-2"]["response"]["body"]["choices"]) == 2  # n = 2
    assert records["chat-3"]["response"]["body"]["choices"][0]["logprobs"] is not None
    assert records["completion-2"]["response"]["body"]["choices"][0]["logprobs"] is not None
    assert records["completion-1"]["response"]["body"]["object"] == "text_completion"
