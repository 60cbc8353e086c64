"""The batch output file: whole lines only, a torn tail repaired on reopen, answered requests read back."""
import json

import pytest

from fastdeploy.entrypoints.batch.output_file import OutputFile


def record(custom_id, line=None, ok=True):
    if ok:
        return {"id": "batch_req_x", "custom_id": custom_id, "response": {"status_code": 200}, "error": None}
    return {"id": "batch_req_x", "custom_id": custom_id, "response": None,
            "error": {"code": "invalid_json", "message": "m", "line": line, "status_code": 400}}


def lines_of(path):
    return [json.loads(t) for t in path.read_text(encoding="utf-8").splitlines()]


def test_appended_records_are_whole_lines_and_read_back_as_answered(tmp_path):
    path = tmp_path / "out.jsonl"
    out = OutputFile(str(path))
    out.append(record("a"))
    out.append(record(None, line=7, ok=False))
    out.append(record("b", ok=False))
    out.close()
    assert [r["custom_id"] for r in lines_of(path)] == ["a", None, "b"]
    again = OutputFile(str(path))
    assert again.answered_ids == {"a", "b"} and again.answered_lines == {7}
    assert again.is_answered("a", 1) and again.is_answered(None, 7)
    assert not again.is_answered("c", 3) and not again.is_answered(None, 8)
    again.close()


@pytest.mark.parametrize("tail", [b'{"id": "batch_req_y", "custom_id": "c", "resp', b'{"custom_id": "c"}',
                                  b'{"custom_id": "c", "x": [1,\n', b"\n"])
def test_a_torn_last_line_is_cut_off_and_its_request_counts_as_unanswered(tmp_path, tail):
    path = tmp_path / "out.jsonl"
    good = (json.dumps(record("a")) + "\n").encode()
    path.write_bytes(good + tail)
    out = OutputFile(str(path))  # a line without its newline is torn even when its JSON is complete
    assert path.read_bytes() == good
    assert out.answered_ids == {"a"}, "the torn line's request must run again"
    out.append(record("c"))
    out.close()
    assert [r["custom_id"] for r in lines_of(path)] == ["a", "c"]


def test_a_corrupt_line_before_the_last_is_refused_not_guessed(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps(record("a")) + "\nnot json\n" + json.dumps(record("b")) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        OutputFile(str(path))
