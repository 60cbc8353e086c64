"""ERNIE-4.5-VL videos: decode, sample frames, draw each frame's timestamp, make the frame count even.

Follows FastDeploy 2.3's ERNIE-4.5-VL processor (`process.py` `_load_and_process_video`,
`_set_video_frame_args`; `process_video.py` `get_frame_indices`; `utils/render_timestamp.py`):
  - the frame count: `n = int(duration * fps)` frames at `fps` (default 2); below `min_frames` (16) the
    video is sampled at `min_frames` evenly spaced frames instead, above `max_frames` (180) at
    `max_frames`; a positive `target_frames` asks for that many directly;
  - spaced frames: the video's `vlen` frames split into `k` intervals `linspace(0, vlen, k + 1)` cast to
    int; "leading" takes each interval's first frame, "middle" its middle one;
  - frames at `fps`: "leading" takes the frames at seconds `0, 1/fps, 2/fps, ... < duration`, "middle"
    the middles of those clips, each `round(seconds * video_fps)` (numpy rounding), kept if < vlen;
  - each frame's time `index * duration / vlen` is drawn at its top-left corner as
    `time: HH:MM:SS.ss`, font size `int(0.1 * min(w, h))`, black with a white outline of a tenth of
    the font size; FastDeploy ships Roboto-Regular, here the Roboto of the `fontpkg-roboto` package;
  - an odd frame count repeats the last frame (the resampler pairs frames).
Where this differs from FastDeploy: a positive `target_frames` switches fps sampling off by itself
(FastDeploy raises unless fps is also set negative); "rand" sampling is not offered (outputs would
not be reproducible).
Decoding goes through decord (pinned; `open_video` is the one place that touches it).
"""
from __future__ import annotations

import io
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Union

import numpy as np

FRAMES_SAMPLE = ("leading", "middle")
TIMESTAMP_FONT_RATE = 0.1  # font size as a fraction of min(width, height)

VideoSource = Union[str, Path, bytes, bytearray]


@dataclass(frozen=True)
class VideoSampling:
    """How frames are taken from a video (FastDeploy's `video_*` processor settings; see module doc).

    Attributes:
        fps: frames per second of video to sample (> 0), or -1 with `target_frames`.
        min_frames: at least this many frames (0 = no bound).
        max_frames: at most this many frames (0 = no bound).
        target_frames: exactly this many evenly spaced frames (or the video's length if shorter); -1 = off.
        frames_sample: "leading" or "middle" frame of each interval.
    """

    fps: float = 2
    min_frames: int = 16
    max_frames: int = 180
    target_frames: int = -1
    frames_sample: str = "leading"

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            kinds, what = {"fps": ((int, float), "a number"), "frames_sample": (str, "a str")}.get(f.name, (int, "an int"))
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise ValueError(f"video setting {f.name}={value!r} must be {what}")
        if self.frames_sample not in FRAMES_SAMPLE:
            raise ValueError(f"frames_sample={self.frames_sample!r} is not supported; choose one of {FRAMES_SAMPLE}")
        if self.target_frames <= 0 and self.fps <= 0:
            raise ValueError(f"fps={self.fps}: a positive fps is needed unless target_frames > 0")
        if 0 < self.max_frames < self.min_frames:
            raise ValueError(f"min_frames={self.min_frames} must not exceed max_frames={self.max_frames}")
        if self.target_frames > 0 and 0 < self.max_frames < self.target_frames:
            raise ValueError(f"target_frames={self.target_frames} exceeds max_frames={self.max_frames}")
        if 0 < self.target_frames < self.min_frames:
            raise ValueError(f"target_frames={self.target_frames} is below min_frames={self.min_frames}")

    def with_overrides(self, overrides: dict) -> "VideoSampling":
        """A copy with a video item's own settings ({"fps": 1, "max_frames": 30, ...}); ValueError for
        an unknown key or a bad value."""
        names = [f.name for f in fields(self)]
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise ValueError(f"unknown video setting(s) {unknown}; accepted: {names}")
        return replace(self, **overrides)


@dataclass(frozen=True)
class OpenedVideo:
    """A decoded-on-demand video: `num_frames`, `fps` (average), and `frames(indices)` ->
    [len(indices), H, W, 3] uint8 RGB."""

    reader: object
    num_frames: int
    fps: float

    @property
    def duration(self) -> float:
        return self.num_frames / self.fps

    def frames(self, indices: list[int]) -> np.ndarray:
        return self.reader.get_batch(list(indices)).asnumpy()


def open_video(source: VideoSource) -> OpenedVideo:
    """Open a video file (path) or its bytes with decord. Raises ImportError naming the `[vl]` extra
    when decord is missing, FileNotFoundError for a missing path, ValueError for undecodable data."""
    try:
        import decord
    except ImportError as e:
        raise ImportError('videos need decord: pip install "fastdeploy[vl]"') from e
    if isinstance(source, (bytes, bytearray)):
        handle = io.BytesIO(bytes(source))
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"video file {str(source)!r} does not exist")
        handle = str(path)
    try:
        reader = decord.VideoReader(handle, num_threads=1)
    except (decord.DECORDError, RuntimeError) as e:
        raise ValueError(f"cannot decode the video: {e}") from e
    fps = float(reader.get_avg_fps())
    if len(reader) == 0 or not fps > 0:
        raise ValueError(f"the video has {len(reader)} frames at {fps} fps: nothing to sample")
    return OpenedVideo(reader, len(reader), fps)


def resolve_frame_count(sampling: VideoSampling, duration: float) -> tuple[int, float]:
    """(target_frames, fps) actually used: target_frames > 0 means evenly spaced frames, else fps."""
    if sampling.target_frames > 0:
        return sampling.target_frames, -1
    at_fps = int(duration * sampling.fps)
    if sampling.min_frames > 0 and at_fps < sampling.min_frames:
        return sampling.min_frames, -1
    if sampling.max_frames > 0 and at_fps > sampling.max_frames:
        return sampling.max_frames, -1
    return -1, sampling.fps


def frame_indices(num_frames: int, video_fps: float, target_frames: int, fps: float,
                  frames_sample: str) -> list[int]:
    """Indices of the frames to take from a video of `num_frames` frames at `video_fps` (see module doc)."""
    if target_frames > 0:
        count = min(target_frames, num_frames)
        bounds = np.linspace(0, num_frames, count + 1).astype(int)
        starts, ends = bounds[:-1], bounds[1:] - 1
        return [int(i) for i in (starts if frames_sample == "leading" else (starts + ends) // 2)]
    duration = num_frames / video_fps
    step = 1 / fps
    seconds = np.arange(0, duration, step) if frames_sample == "leading" else np.arange(step / 2, duration + step / 2, step)
    return [int(i) for i in np.around(seconds * video_fps).astype(int) if i < num_frames]


def format_timestamp(seconds: float) -> str:
    """"time: HH:MM:SS.ss" (seconds with two decimals, zero-padded to 5 characters)."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"time: {int(hours):02d}:{int(minutes):02d}:{secs:05.02f}"


def timestamp_font(size: int):
    """Roboto (Regular instance) at `size` pixels, from the fontpkg-roboto package (the [vl] extra)."""
    from PIL import ImageFont

    try:
        import fontpkg_roboto
    except ImportError as e:
        raise ImportError('drawing video timestamps needs fontpkg-roboto: pip install "fastdeploy[vl]"') from e
    return ImageFont.truetype(str(fontpkg_roboto.ROOT / "files" / "Roboto[wdth,wght].ttf"), size)


def draw_timestamp(frame, seconds: float):
    """Draw `format_timestamp(seconds)` at the frame's top-left corner, in place; returns the frame.
    Frames under 10 pixels on a side get no text (the font size would be 0)."""
    from PIL import ImageDraw

    size = int(min(frame.width, frame.height) * TIMESTAMP_FONT_RATE)
    if size > 0:
        ImageDraw.Draw(frame).text((0, 0), format_timestamp(seconds), font=timestamp_font(size), fill=(0, 0, 0),
                                   stroke_width=int(size * 0.1), stroke_fill=(255, 255, 255))
    return frame


def sample_video(source: VideoSource, sampling: VideoSampling) -> list:
    """The frames the model sees: sampled, timestamped PIL RGB images at the video's size, an even count."""
    from PIL import Image

    video = open_video(source)
    target_frames, fps = resolve_frame_count(sampling, video.duration)
    indices = frame_indices(video.num_frames, video.fps, target_frames, fps, sampling.frames_sample)
    if not indices:
        raise ValueError(f"no frame sampled from a {video.duration:.3f} s video at fps={fps}")
    pixels = video.frames(indices)  # [n, H, W, 3] uint8
    frames = [draw_timestamp(Image.fromarray(p, "RGB"), i * video.duration / video.num_frames)
              for p, i in zip(pixels, indices)]
    if len(frames) % 2:
        frames.append(frames[-1].copy())
    return frames

