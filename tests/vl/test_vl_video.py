"""ERNIE-4.5-VL video sampling: frame counts and indices against FastDeploy's formulas worked by hand, frames
against decord's own decode of a lossless mp4 (made here with imageio-ffmpeg), timestamps against an
independent PIL drawing with FastDeploy's parameters."""
import numpy as np
import pytest
from PIL import Image, ImageDraw

from fastdeploy.input.video_processor import (VideoSampling, format_timestamp, frame_indices, open_video,
                                              resolve_frame_count, sample_video, timestamp_font)
from vl_helpers import color_frames, write_mp4


def indices(num_frames, video_fps, **settings):
    sampling = VideoSampling(**settings)
    target, fps = resolve_frame_count(sampling, num_frames / video_fps)
    return frame_indices(num_frames, video_fps, target, fps, sampling.frames_sample)


def test_defaults_at_2_fps_leading():
    # 100 frames at 10 fps = 10 s -> int(10 * 2) = 20 frames, within [16, 180]: seconds 0, 0.5, ... 9.5
    assert indices(100, 10) == list(range(0, 100, 5))


def test_fewer_than_min_frames_takes_min_frames_evenly_spaced():
    # 40 frames at 10 fps = 4 s -> 8 < 16 frames: linspace(0, 40, 17) cast to int, interval starts
    assert indices(40, 10) == [0, 2, 5, 7, 10, 12, 15, 17, 20, 22, 25, 27, 30, 32, 35, 37]
    # a video shorter than min_frames gives every frame
    assert indices(12, 4) == list(range(12))


def test_more_than_max_frames_takes_max_frames():
    # 1000 frames at 10 fps = 100 s -> 200 > 180: 180 interval starts of linspace(0, 1000, 181)
    got = indices(1000, 10)
    assert len(got) == 180 and got[:6] == [0, 5, 11, 16, 22, 27] and got[-1] == 994


def test_item_overrides_max_frames_and_fps():
    assert indices(1000, 10, max_frames=30)[:4] == [0, 33, 66, 100]
    # fps 1 over 30 s of video at 25 fps: one frame per second
    assert indices(750, 25, fps=1) == list(range(0, 750, 25))


def test_target_frames_and_middle_sampling():
    # target_frames switches fps off; "middle" takes (start + end) // 2 of each interval [start, next - 1]
    assert indices(40, 10, target_frames=16, frames_sample="middle")[:4] == [0, 3, 5, 8]
    assert indices(40, 10, target_frames=20, max_frames=20, min_frames=4) == list(range(0, 40, 2))
    # fps with "middle": clip middles 0.25, 0.75, ... s -> round(s * 10) (numpy rounds half to even)
    assert indices(100, 10, frames_sample="middle")[:4] == [2, 8, 12, 18]


@pytest.mark.parametrize("settings,match", [
    (dict(fps="2"), "fps"), (dict(max_frames=2.5), "max_frames"), (dict(frames_sample="rand"), "frames_sample"),
    (dict(min_frames=20, max_frames=10), "min_frames"), (dict(target_frames=200), "max_frames"),
    (dict(target_frames=4), "min_frames"), (dict(fps=0), "fps"),
])
def test_bad_settings_raise(settings, match):
    with pytest.raises(ValueError, match=match):
        VideoSampling(**settings)


def test_unknown_override_key_raises():
    with pytest.raises(ValueError, match="unknown video setting"):
        VideoSampling().with_overrides({"max_frame": 3})


def test_timestamp_text():
    assert format_timestamp(0.5) == "time: 00:00:00.50"
    assert format_timestamp(3725.25) == "time: 01:02:05.25"


def fastdeploy_drawn(frame: np.ndarray, seconds: float) -> np.ndarray:
    """Oracle: FastDeploy's drawing parameters applied with PIL directly."""
    image = Image.fromarray(frame, "RGB")
    size = int(min(image.size) * 0.1)
    ImageDraw.Draw(image).text((0, 0), format_timestamp(seconds), font=timestamp_font(size), fill=(0, 0, 0),
                               stroke_width=int(size * 0.1), stroke_fill=(255, 255, 255))
    return np.asarray(image)


@pytest.mark.parametrize("source_kind", ["path", "bytes"])
def test_sampled_frames_are_decords_frames_with_timestamps(tmp_path, source_kind):
    import decord

    raw = color_frames(9, height=120, width=160)
    data = write_mp4(tmp_path / "v.mp4", raw, fps=3)
    source = str(tmp_path / "v.mp4") if source_kind == "path" else data
    frames = sample_video(source, VideoSampling())
    # 3 s -> 6 < 16 frames -> 16 evenly spaced of 9 -> all 9 -> odd: the last repeated
    assert len(frames) == 10
    decoded = decord.VideoReader(str(tmp_path / "v.mp4")).get_batch(list(range(9))).asnumpy()
    for i in range(9):
        np.testing.assert_array_equal(np.asarray(frames[i]), fastdeploy_drawn(decoded[i], i / 3))
    np.testing.assert_array_equal(np.asarray(frames[9]), np.asarray(frames[8]))
    assert not np.array_equal(np.asarray(frames[0]), decoded[0])  # the text is there
    np.testing.assert_array_equal(np.asarray(frames[0])[60:], decoded[0][60:])  # and only at the top


def test_open_video_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_video(tmp_path / "missing.mp4")
    with pytest.raises(ValueError, match="cannot decode"):
        open_video(b"not a video at all")
