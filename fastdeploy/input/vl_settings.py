"""ERNIE-4.5-VL preprocessing settings: built-in defaults < the checkpoint's preprocessor_config.json <
`LLM(mm_processor_kwargs=...)`, each value checked where it is read.

preprocessor_config.json, in either of its two styles (other keys, e.g. `image_processor_type`, are
ignored):
  - FastDeploy / PaddleFormers (`AdaptiveImageProcessor`): flat `min_pixels`, `max_pixels`,
    `spatial_conv_size` (or `merge_size`), `temporal_conv_size`;
  - transformers (`Ernie4_5_VLMoeImageProcessor`): `size: {"shortest_edge": min pixels,
    "longest_edge": max pixels}` and `merge_size`; `size` wins over flat `min_pixels` / `max_pixels`
    (transformers reads only `size`);
  - both: `patch_size`, `resample` (a PIL filter number, 3 = BICUBIC), `rescale_factor`, `image_mean`,
    `image_std`; and the video settings under FastDeploy's `mm_processor_kwargs` names (`video_min_pixels`,
    `video_max_pixels`, `video_fps`, `video_min_frames`, `video_max_frames`, `video_target_frames`,
    `video_frames_sample`). `do_resize`, `do_rescale`, `do_normalize`, `do_convert_rgb` may only be true.
A malformed value is a ValueError naming the file, the key and the value; two keys of the file that
name one setting with different values (`merge_size` and `spatial_conv_size`) are one too.

`mm_processor_kwargs` takes FastDeploy's keys (ernie4_5_vl_processor.py `_parse_processor_kwargs`:
`image_min_pixels`, `image_max_pixels`, `video_*` as above, `spatial_conv_size` = the merge size,
`temporal_conv_size`) and the file's `image_mean`, `image_std`, `rescale_factor`, `resample`; an unknown
key, a wrong type or a bad value is a ValueError (FastDeploy logs and ignores the whole dict instead).
Where the file and FastDeploy differ: FastDeploy's processor passes its own `image_min_pixels` /
`image_max_pixels` (defaults or kwargs) to the resize, so it never uses the file's pixel range;
transformers does (`size`), and so does this engine.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from fastdeploy.input import image_processor as improc
from fastdeploy.input.video_processor import VideoSampling

PREPROCESSOR_CONFIG = "preprocessor_config.json"
VIDEO_KEYS = {"video_fps": "fps", "video_min_frames": "min_frames", "video_max_frames": "max_frames",
              "video_target_frames": "target_frames", "video_frames_sample": "frames_sample"}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _channels(positive: bool) -> Callable:
    def check(value) -> bool:
        return (isinstance(value, (list, tuple)) and len(value) == 3 and all(_is_number(v) for v in value)
                and (not positive or all(v > 0 for v in value)))
    return check


POSITIVE_INT = (lambda v: _is_int(v) and v > 0, "a positive int")
# setting -> (check, what is allowed)
CHECKS = {
    **{name: POSITIVE_INT for name in ("image_min_pixels", "image_max_pixels", "video_min_pixels",
                                       "video_max_pixels", "patch_size", "merge_size")},
    "temporal_conv_size": (lambda v: _is_int(v) and v == 2, "2 (the resampler pairs frames)"),
    "resample": (lambda v: _is_int(v) and v in improc.RESAMPLE_FILTERS,
                 f"a PIL resampling filter number in {list(improc.RESAMPLE_FILTERS)} (3: BICUBIC)"),
    "rescale_factor": (lambda v: _is_number(v) and v > 0, "a positive number"),
    "image_mean": (_channels(positive=False), "a list of 3 numbers (R, G, B)"),
    "image_std": (_channels(positive=True), "a list of 3 positive numbers (R, G, B)"),
    "video_fps": (_is_number, "a number"),
    "video_min_frames": (_is_int, "an int"),
    "video_max_frames": (_is_int, "an int"),
    "video_target_frames": (_is_int, "an int"),
    "video_frames_sample": (lambda v: isinstance(v, str), "a str"),
}
SHARED_KEYS = ("patch_size", "merge_size", "temporal_conv_size", "resample", "rescale_factor", "image_mean",
               "image_std", *VIDEO_KEYS, "video_min_pixels", "video_max_pixels")
# preprocessor_config.json key -> setting (`size` is read apart)
FILE_KEYS = {**{k: k for k in SHARED_KEYS}, "min_pixels": "image_min_pixels", "max_pixels": "image_max_pixels",
             "spatial_conv_size": "merge_size"}
# mm_processor_kwargs key -> setting
KWARG_KEYS = {**{k: k for k in CHECKS if k not in ("patch_size", "merge_size")}, "spatial_conv_size": "merge_size"}
MM_PROCESSOR_KWARGS = tuple(sorted(KWARG_KEYS))
SWITCHES = ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb")  # may only be true


@dataclass(frozen=True)
class VLSettings:
    """The processor's settings (module docstring). `sources` maps each setting that did not keep its
    default to where it came from (the file's path and key, or `mm_processor_kwargs[key]`)."""

    image_min_pixels: int = improc.IMAGE_MIN_PIXELS
    image_max_pixels: int = improc.IMAGE_MAX_PIXELS
    video_min_pixels: int = improc.VIDEO_MIN_PIXELS
    video_max_pixels: int = improc.VIDEO_MAX_PIXELS
    pixels: improc.PixelFormat = improc.DEFAULT_FORMAT
    video: VideoSampling = field(default_factory=VideoSampling)
    sources: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_kwargs(cls, kwargs: Optional[dict]) -> "VLSettings":
        """The defaults with `mm_processor_kwargs` over them; ValueError for an unknown key, a wrong type or
        a bad value."""
        return cls.load(None, kwargs)

    @classmethod
    def load(cls, model_dir, kwargs: Optional[dict] = None) -> "VLSettings":
        """Defaults < `model_dir`/preprocessor_config.json (when the directory has one) < `kwargs`.
        ValueError as the module docstring says."""
        values, sources = {}, {}
        path = Path(model_dir) / PREPROCESSOR_CONFIG if model_dir is not None else None
        if path is not None and path.is_file():
            for setting, (value, where) in _read_file(path).items():
                values[setting], sources[setting] = value, where
        kwargs = dict(kwargs or {})
        unknown = sorted(set(kwargs) - set(KWARG_KEYS))
        if unknown:
            raise ValueError(f"mm_processor_kwargs has unknown key(s) {unknown}; accepted: {list(MM_PROCESSOR_KWARGS)}")
        for key, value in kwargs.items():
            where = f"mm_processor_kwargs[{key!r}]"
            values[KWARG_KEYS[key]], sources[KWARG_KEYS[key]] = _checked(KWARG_KEYS[key], value, where), where
        return cls._build(values, sources)

    @classmethod
    def _build(cls, values: dict, sources: dict) -> "VLSettings":
        values.pop("temporal_conv_size", None)  # checked to be 2: nothing to set
        video = {VIDEO_KEYS[k]: values.pop(k) for k in list(values) if k in VIDEO_KEYS}
        try:
            sampling = VideoSampling().with_overrides(video)
        except ValueError as e:
            where = ", ".join(sorted({sources[k] for k in sources if k in VIDEO_KEYS}))
            raise ValueError(f"{where}: {e}") from None
        fmt_keys = [k for k in values if k not in ("image_min_pixels", "image_max_pixels", "video_min_pixels",
                                                     "video_max_pixels")]
        fmt = replace(improc.DEFAULT_FORMAT, **{k: _tuple(values.pop(k)) for k in fmt_keys})
        settings = cls(**values, pixels=fmt, video=sampling, sources=dict(sources))
        for kind in ("image", "video"):
            low, high = f"{kind}_min_pixels", f"{kind}_max_pixels"
            if getattr(settings, low) > getattr(settings, high):
                raise ValueError(f"{low}={getattr(settings, low)} ({settings.source(low)}) exceeds "
                                 f"{high}={getattr(settings, high)} ({settings.source(high)})")
        return settings

    def source(self, setting: str) -> str:
        """Where `setting` came from: the file's path and key, `mm_processor_kwargs[...]` or "default"."""
        return self.sources.get(setting, "default")


def _tuple(value):
    return tuple(value) if isinstance(value, list) else value


def _checked(setting: str, value, where: str):
    check, allowed = CHECKS[setting]
    if not check(value):
        raise ValueError(f"{where}={value!r} is not allowed: expected {allowed}")
    return value


def _read_file(path: Path) -> dict:
    """{setting: (value, "path key")} of preprocessor_config.json; ValueError naming the file, key and value."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    found = {}

    def put(setting: str, key: str, value) -> None:
        where = f"{path} key {key!r}"
        value = _checked(setting, value, where)
        if setting in found and found[setting][0] != value:
            other, other_where = found[setting]
            raise ValueError(f"{where}={value!r} and {other_where}={other!r} set one setting ({setting}) to "
                             "different values")
        found[setting] = (value, where)

    for key in SWITCHES:
        if key in data and data[key] is not True:
            raise ValueError(f"{path} key {key!r}={data[key]!r} is not supported: only true is")
    for key, setting in FILE_KEYS.items():
        if key in data:
            put(setting, key, data[key])
    if "size" in data:
        size = data["size"]
        if not isinstance(size, dict) or not {"shortest_edge", "longest_edge"} >= set(size) or not size:
            raise ValueError(f"{path} key 'size'={size!r} is not allowed: expected "
                             '{"shortest_edge": min pixels, "longest_edge": max pixels}')
        for edge, setting in (("shortest_edge", "image_min_pixels"), ("longest_edge", "image_max_pixels")):
            if edge in size:  # transformers' key wins over the flat one
                found.pop(setting, None)
                put(setting, f"size.{edge}", size[edge])
    return found
