"""The output file of a batch job: append-only JSONL that survives being killed at any moment.

Every record is written as one whole line (`json.dumps` + newline in a single unbuffered write
call) before the next request's answer is taken: once written it is in the operating system's
hands, so killing the process (SIGKILL included) loses nothing written. The file is fsync'ed at
most every FSYNC_SECONDS and at close, so a power loss or kernel crash loses at most that last
stretch of answers (resume answers them again); an fsync per line would cost ~1-5 ms a request.
A crash can leave at most one torn line: the last one, without its newline or cut inside its JSON. Opening the file again repairs that tail (the torn
line is cut off; its request is answered again) and reads which requests are already answered:
every record's `custom_id`, and, for input lines that had no usable custom_id, their line number.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Optional, TextIO

logger = logging.getLogger("fastdeploy")

FSYNC_SECONDS = 1.0


class OutputFile:
    """Appends records to `path` (created when missing); `answered_ids`/`answered_lines` say what
    an earlier run of the same job already wrote. path "-" writes to stdout (no resume)."""

    def __init__(self, path: str):
        self.answered_ids: set[str] = set()
        self.answered_lines: set[int] = set()
        self.num_repaired_bytes = 0
        self._stdout: Optional[TextIO] = None
        if path == "-":
            import sys

            self._stdout = sys.stdout
            return
        target = Path(path)
        if target.exists():
            self.num_repaired_bytes = _repair_tail(target)
            self._read_answered(target)
        self._file = open(target, "ab", buffering=0)
        self._synced_at = time.monotonic()

    def is_answered(self, custom_id: Optional[str], line: int) -> bool:
        return custom_id in self.answered_ids if custom_id is not None else line in self.answered_lines

    def append(self, record: dict) -> None:
        """Write one record as one whole line before returning (fsync'ed within FSYNC_SECONDS)."""
        text = json.dumps(record, ensure_ascii=False) + "\n"
        if self._stdout is not None:
            self._stdout.write(text)
            self._stdout.flush()
        else:
            data = memoryview(text.encode("utf-8"))
            while data:  # unbuffered: one write call for the whole line (regular files take it at once)
                data = data[self._file.write(data):]
            if time.monotonic() - self._synced_at >= FSYNC_SECONDS:
                os.fsync(self._file.fileno())
                self._synced_at = time.monotonic()
        self._remember(record)

    def close(self) -> None:
        if self._stdout is None:
            os.fsync(self._file.fileno())
            self._file.close()

    def _read_answered(self, target: Path) -> None:
        with open(target, encoding="utf-8") as f:
            for number, text in enumerate(f, 1):
                try:
                    record = json.loads(text)
                except json.JSONDecodeError:
                    raise ValueError(f"output file {target} line {number} is not JSON (and not the last line, "
                                     "which a crash may tear): it was not written by run_batch; "
                                     "pass another -o") from None
                if not isinstance(record, dict):
                    raise ValueError(f"output file {target} line {number} is not a batch output record")
                self._remember(record)

    def _remember(self, record: dict) -> None:
        custom_id = record.get("custom_id")
        if custom_id is not None:
            self.answered_ids.add(custom_id)
        else:
            line = (record.get("error") or {}).get("line")
            if line is not None:
                self.answered_lines.add(line)


def _repair_tail(target: Path) -> int:
    """Cut a torn last line (no final newline, or not JSON) off `target`; returns the bytes removed."""
    size = target.stat().st_size
    if size == 0:
        return 0
    with open(target, "rb+") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1 if not data.endswith(b"\n") else _last_good_end(data)
        if keep == size:
            return 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    logger.warning("output file %s ended in a torn line (%d bytes, a crash mid-write): removed; its request "
                   "runs again", target, size - keep)
    return size - keep


def _last_good_end(data: bytes) -> int:
    """Length to keep when the file ends with a newline: drop the last line if it is not JSON."""
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    try:
        json.loads(data[start:])
        return len(data)
    except ValueError:
        return start
