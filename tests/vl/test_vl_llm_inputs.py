"""LLM.chat / LLM.generate with images and videos on the tiny VL checkpoint, checked at the runner's door
(a recording executor stands in for the model): what each request carries, the URL forms, the limits,
the settings, and errors raised before any work with the engine serving the next request."""
import base64
import io
import socket
import warnings

import numpy as np
import pytest

from vl_fakes import RecordingExecutor, random_image
from fastdeploy import SamplingParams
from fastdeploy.input.image_processor import preprocess_image
from vl_helpers import TOKEN_IDS, color_frames, write_mp4

IMAGE = TOKEN_IDS["image_token_id"]
PARAMS = SamplingParams(max_tokens=3, temperature=0)


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def ask(*parts, text="Describe."):
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@pytest.fixture
def image_file(tmp_path):
    image = random_image(60, 90, 3)
    path = tmp_path / "cat.png"
    image.save(path)
    return image, path


def test_chat_url_forms_reach_the_runner_with_the_same_pixels(recording_llm, image_file):
    image, path = image_file
    llm = recording_llm()
    urls = [f"file://{path}", str(path), "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()]
    outs = llm.chat([ask(image_part(u)) for u in urls], PARAMS, use_tqdm=False)
    expected, grid = preprocess_image(image)
    assert len(RecordingExecutor.sent) == 3
    for out, new in zip(outs, RecordingExecutor.sent):
        (f,) = new.mm_features
        np.testing.assert_array_equal(f.pixel_values, expected)
        assert f.grid_thw == grid and new.prompt_token_ids[f.offset:f.offset + f.length] == [IMAGE] * f.length
        assert new.positions.shape == (3, len(new.prompt_token_ids)) and new.token_type_ids.sum() == f.length
        assert out.num_input_image_tokens == f.length == 6 and out.num_input_video_tokens == 0
        assert out.outputs.token_ids == [RecordingExecutor.TOKEN] * 3
        assert "Picture 1:<|IMAGE_START|><|image@placeholder|><|IMAGE_END|>" in out.prompt


def test_generate_with_multimodal_data_matches_chat(recording_llm, image_file):
    image, path = image_file
    llm = recording_llm()
    chat_out = llm.chat(ask(image_part(str(path))), PARAMS, use_tqdm=False)[0]
    gen_out = llm.generate({"prompt": chat_out.prompt, "multimodal_data": {"image": [image]}}, PARAMS, use_tqdm=False)[0]
    assert gen_out.prompt_token_ids == chat_out.prompt_token_ids
    assert RecordingExecutor.sent[0].mm_features[0].mm_hash == RecordingExecutor.sent[1].mm_features[0].mm_hash


def test_chat_video_url(recording_llm, tmp_path):
    path = tmp_path / "v.mp4"
    write_mp4(path, color_frames(8, height=56, width=84), fps=4)
    llm = recording_llm(mm_processor_kwargs={"video_min_pixels": 28 * 28 * 4, "video_max_pixels": 28 * 28 * 6,
                                             "video_min_frames": 4})
    out = llm.chat(ask({"type": "video_url", "video_url": {"url": f"file://{path}"}}), PARAMS, use_tqdm=False)[0]
    (f,) = RecordingExecutor.sent[0].mm_features
    assert f.modality == "video" and f.grid_thw == (4, 4, 6) and out.num_input_video_tokens == 12
    assert RecordingExecutor.sent[0].token_type_ids.tolist().count(2) == 12


def test_limit_counts_image_url_parts_and_is_merged_over_the_default(recording_llm, image_file):
    _, path = image_file
    two = ask(image_part(str(path)), image_part(str(path)))
    llm = recording_llm()
    with pytest.raises(ValueError, match="Too many image items in prompt.*got 2 but limit is 1"):
        llm.chat(two, PARAMS, use_tqdm=False)
    assert not RecordingExecutor.sent
    assert llm.chat(ask(image_part(str(path))), PARAMS, use_tqdm=False)[0].num_input_image_tokens == 6  # served next
    llm = recording_llm(limit_mm_per_prompt={"image": 2})
    assert llm.chat(two, PARAMS, use_tqdm=False)[0].num_input_image_tokens == 12
    with pytest.raises(ValueError, match="Too many video items"):  # video's limit is still the default 1
        llm.generate({"prompt": "x", "multimodal_data": {"video": [b"1", b"2"]}}, PARAMS, use_tqdm=False)


@pytest.mark.parametrize("conversation,error,match", [
    (ask(image_part("/no/such/file.png")), FileNotFoundError, "does not exist"),
    (ask(image_part("ftp://host/x.png")), ValueError, "unsupported media URL scheme"),
    (ask(image_part("data:image/png;base64,@@@")), ValueError, "base64"),
    (ask(image_part("data:image/png;base64," + base64.b64encode(b"not an image").decode())), ValueError,
     "cannot read an image"),
    (ask({"type": "audio_url", "audio_url": {"url": "x"}}), ValueError, "Unknown content part type 'audio_url'"),
    (ask({"type": "image_url", "image_url": {}}), ValueError, "needs"),
])
def test_bad_parts_raise_before_work_and_the_next_request_is_served(recording_llm, image_file, conversation, error,
                                                                    match):
    _, path = image_file
    llm = recording_llm()
    with pytest.raises(error, match=match):
        llm.chat([ask(image_part(str(path))), conversation], PARAMS, use_tqdm=False)  # the good one is not run either
    assert not RecordingExecutor.sent
    assert llm.chat(ask(image_part(str(path))), PARAMS, use_tqdm=False)[0].outputs.token_ids


def test_http_url_offline_gives_a_clear_error(recording_llm, monkeypatch):
    llm = recording_llm()

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "getaddrinfo", offline)
    monkeypatch.setattr(socket, "create_connection", offline)
    with pytest.raises(ConnectionError, match="cannot fetch 'http://example.invalid/cat.jpg'.*file://"):
        llm.chat(ask(image_part("http://example.invalid/cat.jpg")), PARAMS, use_tqdm=False)
    assert not RecordingExecutor.sent


def test_http_url_is_fetched(recording_llm, image_file):
    """From a server on this machine's loopback interface (no network)."""
    import http.server
    import threading

    image, path = image_file
    data = path.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        llm = recording_llm()
        llm.chat(ask(image_part(f"http://127.0.0.1:{server.server_port}/cat.png")), PARAMS, use_tqdm=False)
    finally:
        server.shutdown()
        thread.join(timeout=10)
    np.testing.assert_array_equal(RecordingExecutor.sent[0].mm_features[0].pixel_values, preprocess_image(image)[0])


def test_generate_errors(recording_llm):
    llm = recording_llm()
    with pytest.raises(ValueError, match="1 image placeholder.*0 image"):
        llm.generate("<|image@placeholder|> what?", PARAMS, use_tqdm=False)
    with pytest.raises(ValueError, match="unknown key"):
        llm.generate({"prompt": "x", "multimodal_data": {"images": []}}, PARAMS, use_tqdm=False)
    with pytest.raises(TypeError, match="must be a list"):
        llm.generate({"prompt": "x", "multimodal_data": {"image": random_image(10, 10)}}, PARAMS, use_tqdm=False)
    assert not RecordingExecutor.sent
    assert llm.generate("plain text", PARAMS, use_tqdm=False)[0].outputs.token_ids


def test_enable_mm_is_accepted_with_a_deprecation_warning(recording_llm):
    with pytest.warns(DeprecationWarning, match="enable_mm"):
        recording_llm(enable_mm=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        recording_llm()


@pytest.mark.parametrize("kwargs,match", [
    (dict(mm_processor_kwargs={"video_fps": "fast"}), "video_fps"),
    (dict(mm_processor_kwargs={"max_pixels": 1}), "unknown key"),
    (dict(limit_mm_per_prompt={"picture": 2}), "unknown modality"),
    (dict(limit_mm_per_prompt={"image": -1}), "limit_mm_per_prompt"),
])
def test_bad_multimodal_settings(recording_llm, kwargs, match):
    with pytest.raises(ValueError, match=match):
        recording_llm(**kwargs)


def test_text_model_refuses_images(smollm_llm, image_file):
    _, path = image_file
    with pytest.raises(ValueError, match="takes text only|content parts must be"):
        smollm_llm.chat(ask(image_part(str(path))), PARAMS, use_tqdm=False)
    with pytest.raises(ValueError, match="text model"):
        smollm_llm.generate({"prompt": "x", "multimodal_data": {"image": [random_image(10, 10)]}}, PARAMS,
                            use_tqdm=False)


def test_two_images_and_chat_template_kwargs(recording_llm, image_file):
    _, path = image_file
    llm = recording_llm(limit_mm_per_prompt={"image": 2})
    out = llm.chat(ask(image_part(str(path)), image_part(str(path))), PARAMS, use_tqdm=False,
                   chat_template_kwargs={"enable_thinking": True})[0]
    assert out.prompt.endswith("Assistant: <think>\n") and "Picture 2:" in out.prompt
    a, b = RecordingExecutor.sent[0].mm_features
    assert a.mm_hash == b.mm_hash and b.offset > a.offset + a.length


def test_prefix_cache_hits_follow_the_image(recording_llm, tmp_path):
    """Same text, same image: the image's blocks are served from the cache; another image: only the
    whole blocks before it."""
    llm = recording_llm(block_size=4, max_model_len=256)
    for name, seed in (("a", 1), ("b", 2)):
        random_image(60, 90, seed).save(tmp_path / f"{name}.png")
    first = llm.chat(ask(image_part(str(tmp_path / "a.png"))), PARAMS, use_tqdm=False)[0]
    same = llm.chat(ask(image_part(str(tmp_path / "a.png"))), PARAMS, use_tqdm=False)[0]
    other = llm.chat(ask(image_part(str(tmp_path / "b.png"))), PARAMS, use_tqdm=False)[0]
    assert first.prompt_token_ids == same.prompt_token_ids == other.prompt_token_ids  # placeholders alike
    offset = RecordingExecutor.sent[0].mm_features[0].offset
    n = len(first.prompt_token_ids)
    assert first.num_cached_tokens == 0
    assert same.num_cached_tokens == (n - 1) // 4 * 4
    assert other.num_cached_tokens == offset // 4 * 4 < offset + 6



def test_run_batch_with_image_parts(vl_dir, recording_llm, image_file, tmp_path, smollm_path):
    """run-batch takes the same chat parts (limits and all); a text model answers them with an error record."""
    import json

    from fastdeploy.entrypoints.batch.runner import run_job

    _, path = image_file
    rows = [{"custom_id": "one", "url": "/v1/chat/completions",
             "body": {"messages": ask(image_part(str(path))), "max_tokens": 2}},
            {"custom_id": "two", "url": "/v1/chat/completions",
             "body": {"messages": ask(image_part(str(path)), image_part(str(path))), "max_tokens": 2}}]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recording_llm()  # installs the recording executor for the LLM run_job builds
    kwargs = {"max_model_len": 1024, "num_gpu_blocks_override": 80, "block_size": 16}
    run_job(str(inp), str(tmp_path / "vl.jsonl"), {"model": str(vl_dir), **kwargs}, use_tqdm=False)
    records = {r["custom_id"]: r for r in map(json.loads, (tmp_path / "vl.jsonl").read_text().splitlines())}
    assert records["one"]["error"] is None and records["one"]["response"]["status_code"] == 200
    assert "Too many image items" in records["two"]["error"]["message"]
    assert len(RecordingExecutor.sent) == 1 and RecordingExecutor.sent[0].mm_features[0].length == 6
    run_job(str(inp), str(tmp_path / "text.jsonl"), {"model": smollm_path, "max_model_len": 512}, use_tqdm=False)
    text_records = [json.loads(line) for line in (tmp_path / "text.jsonl").read_text().splitlines()]
    assert len(text_records) == 2 and all("takes text only" in r["error"]["message"] for r in text_records)
