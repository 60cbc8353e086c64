"""A batch job: read OpenAI batch request lines, answer each once, append the answers as they come.

Nothing lost, nothing twice:
1. every input line is parsed first (entrypoints/batch/format.py); two lines with the same
   `custom_id` stop the job before any work (ValueError naming the id and both line numbers);
2. the output file is opened for appending (output_file.py): a torn last line left by a crash is cut
   off, and every request already answered there (success or error record) is skipped;
3. lines that cannot become a request (not JSON, unknown fields, bad values) get an error record;
4. the rest go to the workers (one LLM in this process, or N Ray actors), and each answer is
   appended, whole and fsync'ed, the moment it arrives.
So a job killed at any moment and started again with the same arguments finishes with every
request answered exactly once.
"""
from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Optional

from tqdm import tqdm

from fastdeploy.entrypoints.batch.format import BatchLineError, BatchRequest, error_record, parse_request_line
from fastdeploy.entrypoints.batch.output_file import OutputFile


@dataclass
class Summary:
    """What one run did: records written (`done` answered, `failed` error records) and requests
    `skipped` because an earlier run had answered them; `completion_tokens` generated in this run."""

    done: int = 0
    failed: int = 0
    skipped: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    failures: list = field(default_factory=list)  # (line, message) of the first few failures

    def __str__(self) -> str:
        rate = self.completion_tokens / self.seconds if self.seconds else 0.0
        return (f"{self.done} done, {self.failed} failed, {self.skipped} skipped as already answered; "
                f"{self.completion_tokens} tokens generated in {self.seconds:.1f} s ({rate:.1f} tok/s)")


def read_requests(path: str) -> tuple[list[BatchRequest], list[BatchLineError]]:
    """The parsed requests and the lines that could not be parsed. Blank lines are skipped.
    Raises ValueError for a duplicate custom_id, FileNotFoundError for a missing file."""
    stream = nullcontext(sys.stdin) if path == "-" else open(path, encoding="utf-8")
    requests, errors, seen = [], [], {}
    with stream as stream:
        for number, text in enumerate(stream, 1):
            if not text.strip():
                continue
            try:
                request = parse_request_line(text, number)
                custom_id = request.custom_id
                requests.append(request)
            except BatchLineError as e:
                custom_id = e.custom_id
                errors.append(e)
            if custom_id is not None:
                if custom_id in seen:
                    raise ValueError(f"custom_id {custom_id!r} appears on lines {seen[custom_id]} and {number} of "
                                     f"{path}: custom_ids must be unique (the output is matched to the input by them)")
                seen[custom_id] = number
    return requests, errors


def run_job(input_path: str, output_path: str, engine_kwargs: dict, data_parallel_size: int = 1,
            ray_address: Optional[str] = None, use_tqdm: bool = True) -> Summary:
    """Run (or resume) the job; returns what this run did. See the module docstring."""
    requests, bad_lines = read_requests(input_path)
    out = OutputFile(output_path)
    summary = Summary()
    start = time.perf_counter()
    try:
        for error in bad_lines:
            if out.is_answered(error.custom_id, error.line):
                summary.skipped += 1
                continue
            _write(out, error_record(error.custom_id, error.line, error.code, error.message), summary, error.line)
        todo = [r for r in requests if not out.is_answered(r.custom_id, r.line)]
        summary.skipped += len(requests) - len(todo)
        if todo:
            _answer(todo, out, summary, engine_kwargs, data_parallel_size, ray_address, use_tqdm)
    finally:
        out.close()
        summary.seconds = time.perf_counter() - start
    return summary


def _answer(todo, out, summary, engine_kwargs, data_parallel_size, ray_address, use_tqdm) -> None:
    workers = _make_workers(engine_kwargs, data_parallel_size, ray_address)
    bar = tqdm(total=len(todo), desc="Batch requests", disable=not use_tqdm, file=sys.stderr, dynamic_ncols=True)
    lines = {r.custom_id: r.line for r in todo}
    start = time.perf_counter()
    try:
        for record in workers.process(todo):
            _write(out, record, summary, lines.get(record.get("custom_id")))
            elapsed = max(time.perf_counter() - start, 1e-9)
            bar.set_postfix_str(f"{summary.completion_tokens / elapsed:.1f} tok/s, {summary.failed} failed")
            bar.update(1)
    finally:
        bar.close()
        workers.shutdown()


def _write(out: OutputFile, record: dict, summary: Summary, line: Optional[int]) -> None:
    out.append(record)
    if record.get("error") is not None:
        summary.failed += 1
        if len(summary.failures) < 10:
            summary.failures.append((line, record["error"].get("message")))
        return
    summary.done += 1
    summary.completion_tokens += record["response"]["body"]["usage"].get("completion_tokens", 0)  # 0: pooling


def _make_workers(engine_kwargs: dict, data_parallel_size: int, ray_address: Optional[str]):
    if data_parallel_size == 1 and ray_address is None:
        from fastdeploy.entrypoints.batch.local_worker import LocalWorker

        return LocalWorker(engine_kwargs)
    from fastdeploy.entrypoints.batch.ray_workers import RayWorkers

    return RayWorkers(engine_kwargs, data_parallel_size, ray_address)
