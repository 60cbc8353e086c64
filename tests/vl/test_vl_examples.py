"""The VL examples (examples/vl_chat.py, vl_generate.py) run on the tiny checkpoint with local files, in
this process: the recording executor standing in for the model checks what reaches the runner, and a
last test runs both on the model itself."""
import runpy
import sys

from vl_fakes import RecordingExecutor, random_image
from vl_helpers import color_frames, write_mp4

EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"


def run_example(name, argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [name, *argv])
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    return capsys.readouterr().out


def test_vl_chat_example(vl_dir, recording_llm, tmp_path, monkeypatch, capsys):
    random_image(300, 400).save(tmp_path / "relic.jpg")
    out = run_example("vl_chat.py", [str(vl_dir), str(tmp_path / "relic.jpg"), "--max-tokens", "4"], monkeypatch, capsys)
    (sent,) = RecordingExecutor.sent
    assert sent.mm_features[0].modality == "image"
    assert "Picture 1:<|IMAGE_START|>" in out and f"image tokens: {sent.mm_features[0].length}" in out


def test_vl_generate_example_with_image_and_video(vl_dir, recording_llm, tmp_path, monkeypatch, capsys):
    random_image(300, 400).save(tmp_path / "relic.jpg")
    write_mp4(tmp_path / "clip.mp4", color_frames(6, height=56, width=56), fps=2)
    out = run_example("vl_generate.py", [str(vl_dir), str(tmp_path / "relic.jpg"), str(tmp_path / "clip.mp4"),
                                         "--max-tokens", "4"], monkeypatch, capsys)
    (sent,) = RecordingExecutor.sent
    assert [f.modality for f in sent.mm_features] == ["image", "video"]
    video = sent.mm_features[1]
    assert video.grid_thw[0] == 6  # 3 s: 6 < 16 frames -> all 6 frames of the file (min_frames 16 > length)
    assert f"video tokens: {video.length}" in out and "Assistant: " in out


def test_examples_run_on_the_model(vl_dir, tmp_path, monkeypatch, capsys):
    random_image(300, 400).save(tmp_path / "relic.jpg")
    write_mp4(tmp_path / "clip.mp4", color_frames(6, height=56, width=56), fps=2)
    out = run_example("vl_chat.py", [str(vl_dir), str(tmp_path / "relic.jpg"), "--max-tokens", "4"], monkeypatch, capsys)
    assert "image tokens: 154" in out  # 300x400 -> 308x392 pixels -> 11x14 blocks of 2x2 patches
    out = run_example("vl_generate.py", [str(vl_dir), str(tmp_path / "relic.jpg"), str(tmp_path / "clip.mp4"),
                                         "--max-tokens", "4"], monkeypatch, capsys)
    assert "image tokens: 154, video tokens: " in out and "generated: " in out
