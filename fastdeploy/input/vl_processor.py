"""ERNIE-4.5-VL prompts: images and videos placed in the token ids, with M-RoPE positions and token types.

A prompt marks where each item goes in one of two ways (both may be mixed):
  - FastDeploy's text markers `<|image@placeholder|>` / `<|video@placeholder|>` (what FastDeploy's chat
    template writes), or
  - transformers' placeholder tokens `<|IMAGE_PLACEHOLDER|>` / `<|VIDEO_PLACEHOLDER|>` (its template writes
    one per item; an id prompt may also hold the item's full run). In FastDeploy's Paddle checkpoints
    videos use the image placeholder id too; a run right after `<|VIDEO_START|>` is then a video.
Items fill the marks in prompt order, per modality. Each mark becomes `length` placeholder ids, the
item's encoder rows: with merge size m (2 unless the checkpoint says otherwise) an image of h x w
patches gives h*w/m^2, a video of t frames (t/2)*h*w/m^2. A mark whose
run is neither 1 nor `length` long, or a count of marks that differs from the count of items, is a
ValueError, as is a prompt with more items than `limit_mm_per_prompt` allows.

Positions are `[3, n]` (t, h, w), FastDeploy's rule (process.py `_compute_3d_positions`), equal to
transformers' `get_rope_index` for images: a text token has `(p, p, p)` and advances p by one; an item's
token at (frame pair ti, block row r, block column c) has `(p + ti, p + r, p + c)`, and p continues at the largest
of them + 1. (transformers continues at p + max(rows, columns) after a video, which differs when a video
has more frame pairs than rows and columns.) `token_type_ids` are 1 on image placeholders, 2 on video
placeholders and 0 elsewhere (START/END delimiters are text here, as in FastDeploy and transformers'
mm_token_type_ids; the model routes them to the vision experts by id).
Pixels follow input/vl_settings.py: the checkpoint's preprocessor_config.json under
`mm_processor_kwargs`; a patch or merge size that differs from config.json's vision tower is a
ValueError when the processor is built.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.input import image_processor as improc
from fastdeploy.input.input_processor import InputProcessor, PreparedPrompt, check_text
from fastdeploy.input.video_processor import sample_video
from fastdeploy.input.vl_settings import VLSettings
from fastdeploy.model_executor.models.ernie4_5_vl.config import token_ids, vision_config
from fastdeploy.multimodal import media
from fastdeploy.multimodal.inputs import MultiModalFeature

IMAGE_MARKER = "<|image@placeholder|>"
VIDEO_MARKER = "<|video@placeholder|>"
MODALITIES = ("image", "video")
TOKEN_TYPE = {"image": 1, "video": 2}
DEFAULT_LIMIT_MM_PER_PROMPT = {"image": 1, "video": 1, "audio": 1}

def merge_mm_limits(limits: Optional[dict]) -> dict:
    """`limit_mm_per_prompt` over FastDeploy's default of 1 per modality; ValueError for a bad entry."""
    if limits is None:
        return dict(DEFAULT_LIMIT_MM_PER_PROMPT)
    if not isinstance(limits, dict):
        raise ValueError(f"limit_mm_per_prompt must be a dict like {{'image': 4}}, got {limits!r}")
    for key, value in limits.items():
        if key not in DEFAULT_LIMIT_MM_PER_PROMPT:
            raise ValueError(f"limit_mm_per_prompt has unknown modality {key!r}; accepted: {list(DEFAULT_LIMIT_MM_PER_PROMPT)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"limit_mm_per_prompt[{key!r}] must be an int >= 0, got {value!r}")
    return {**DEFAULT_LIMIT_MM_PER_PROMPT, **limits}


def check_mm_limits(counts: dict, limits: dict, index: Optional[int] = None) -> None:
    """FastDeploy's error when a prompt holds more items of a modality than allowed."""
    where = "" if index is None else f" (prompt {index})"
    for modality, count in counts.items():
        if count > limits.get(modality, 0):
            raise ValueError(f"Too many {modality} items in prompt{where}, got {count} but limit is "
                             f"{limits.get(modality, 0)}: raise LLM(limit_mm_per_prompt={{'{modality}': {count}}})")


@dataclass
class MultiModalData:
    """A prompt's items in order, per modality: images (PIL images) and videos (a path, bytes, or a dict
    {"video": path or bytes, "fps": ..., "max_frames": ..., ...} with per-item sampling overrides)."""

    image: list = field(default_factory=list)
    video: list = field(default_factory=list)

    @classmethod
    def from_dict(cls, data, index: Optional[int] = None) -> "MultiModalData":
        """From FastDeploy's `multimodal_data` dict; ValueError/TypeError for an unknown key or a non-list."""
        where = "" if index is None else f"prompt {index}: "
        if not isinstance(data, dict):
            raise TypeError(f"{where}multimodal_data must be a dict {{'image': [...], 'video': [...]}}, got {type(data).__name__}")
        unknown = sorted(set(data) - set(MODALITIES))
        if unknown:
            raise ValueError(f"{where}multimodal_data has unknown key(s) {unknown}; accepted: {list(MODALITIES)}")
        for key, items in data.items():
            if not isinstance(items, (list, tuple)):
                raise TypeError(f"{where}multimodal_data[{key!r}] must be a list, got {type(items).__name__}")
        return cls(image=list(data.get("image", [])), video=list(data.get("video", [])))

    def counts(self) -> dict:
        return {"image": len(self.image), "video": len(self.video)}


@dataclass
class _Item:
    """One preprocessed image/video before it is placed."""

    modality: str
    pixel_values: np.ndarray  # [num_patches, 3 * patch_size^2] float32
    grid_thw: tuple
    length: int  # placeholder tokens
    mm_hash: str


class VLInputProcessor(InputProcessor):
    """InputProcessor of ERNIE-4.5-VL checkpoints: text prompts get [3, n] positions, and prompts with
    images/videos get them placed (module docstring)."""

    accepts_multimodal = True

    def __init__(self, fd_config, tokenizer):
        super().__init__(fd_config, tokenizer)
        self.token_ids = token_ids(fd_config.model_config.hf_config, tokenizer)  # as the model (config.py)
        self.settings = VLSettings.load(fd_config.model_path, fd_config.mm_processor_kwargs)
        check_against_model(self.settings, fd_config.model_config.hf_config)
        self.limits = merge_mm_limits(fd_config.limit_mm_per_prompt)

    def check_limits(self, counts: dict, index: Optional[int] = None) -> None:
        """ValueError when `counts` ({"image": n, ...}) exceed `limit_mm_per_prompt`."""
        check_mm_limits(counts, self.limits, index)

    def load_media(self, parts: list[tuple[str, str]]) -> MultiModalData:
        """The images (PIL) and videos (path or bytes) that chat parts' URLs name (multimodal/media.py)."""
        data = MultiModalData()
        for modality, url in parts:
            source = media.fetch(url)
            getattr(data, modality).append(media.load_image(source) if modality == "image" else source)
        return data

    def process(self, prompt: Optional[str], prompt_token_ids: Optional[list[int]], params: SamplingParams,
                index: Optional[int] = None, mm_data: Optional[MultiModalData] = None) -> PreparedPrompt:
        """Validate one prompt, preprocess its items and place them. With prompt_token_ids None the
        prompt text is tokenized here, segment by segment around the text markers."""
        mm_data = mm_data or MultiModalData()
        self.check_limits(mm_data.counts(), index)
        if prompt_token_ids is None:  # tokenized here, before the base class would check it
            check_text(prompt, "prompt" if index is None else f"prompt {index}")
        ids, marks = self._marked_ids(prompt, prompt_token_ids)
        items = self._match_items(marks, mm_data, index)
        ids, token_types, features = self._place(ids, marks, items, index)
        merge = self.settings.pixels.merge_size
        budget = self.config.scheduler_config.max_num_batched_tokens
        for n, feature in enumerate(features):
            if feature.length > budget:  # a step computes an item whole (engine/sched/scheduler.py)
                raise ValueError(f"{feature.modality} {n} of prompt {index} takes {feature.length} tokens, more than "
                                 f"max_num_batched_tokens={budget}: raise it, or lower the "
                                 f"{feature.modality}_max_pixels / video_max_frames of mm_processor_kwargs")
        prepared = super().process(prompt, ids, params, index)
        prepared.positions = mrope_positions(token_types, features, merge)
        prepared.token_type_ids = token_types
        prepared.mm_features = features
        return prepared

    # ---- marks: where each item goes ---------------------------------------------------------------
    def _marked_ids(self, prompt: Optional[str], prompt_token_ids: list[int]) -> tuple[list[int], list[tuple]]:
        """(ids with one placeholder id per text marker, [(start, run length, modality)] of each mark)."""
        markers = set()  # positions of text markers: each is a mark of its own
        if prompt_token_ids is not None:
            ids = list(prompt_token_ids)
            kinds = [None] * len(ids)
        else:
            ids, kinds = [], []
            for piece in re.split(f"({re.escape(IMAGE_MARKER)}|{re.escape(VIDEO_MARKER)})", prompt):
                if piece in (IMAGE_MARKER, VIDEO_MARKER):
                    modality = "image" if piece == IMAGE_MARKER else "video"
                    markers.add(len(ids))
                    ids.append(self.token_ids.image if modality == "image" else self.token_ids.video)
                    kinds.append(modality)
                elif piece:
                    encoded = self.tokenizer.encode(piece, add_special_tokens=False)
                    ids.extend(encoded)
                    kinds.extend([None] * len(encoded))
        for i, token in enumerate(ids):  # transformers' placeholder tokens
            if kinds[i] is None and token in (self.token_ids.image, self.token_ids.video):
                after_video_start = i > 0 and (ids[i - 1] == self.token_ids.video_start or kinds[i - 1] == "video")
                is_video = token == self.token_ids.video and (token != self.token_ids.image or after_video_start)
                kinds[i] = "video" if is_video else "image"
        marks, i = [], 0
        while i < len(ids):
            if kinds[i] is None:
                i += 1
                continue
            start = i
            i += 1
            while i < len(ids) and kinds[i] == kinds[start] and start not in markers and i not in markers:
                i += 1
            marks.append((start, i - start, kinds[start]))
        return ids, marks

    def _match_items(self, marks: list[tuple], mm_data: MultiModalData, index: Optional[int]) -> list[_Item]:
        """Check the mark counts against the items, then preprocess every item (in prompt order)."""
        where = "" if index is None else f" (prompt {index})"
        for modality in MODALITIES:
            given = len(getattr(mm_data, modality))
            placed = sum(1 for _, _, kind in marks if kind == modality)
            if placed != given:
                raise ValueError(f"the prompt{where} has {placed} {modality} placeholder(s) but {given} {modality}(s) "
                                 f"were given: each {modality} needs one {IMAGE_MARKER if modality == 'image' else VIDEO_MARKER} "
                                 "(or placeholder token) in the prompt")
        queues = {m: enumerate(getattr(mm_data, m)) for m in MODALITIES}
        items = []
        for _, _, modality in marks:
            n, source = next(queues[modality])
            items.append(self._image(source, n, where) if modality == "image" else self._video(source, n, where))
        return items

    def _image(self, image, n: int, where: str) -> _Item:
        if not all(hasattr(image, a) for a in ("height", "width", "convert")):
            raise TypeError(f"image {n}{where} must be a PIL image, got {type(image).__name__}")
        s = self.settings
        pixels, grid = improc.preprocess_image(image, s.image_min_pixels, s.image_max_pixels, s.pixels)
        return _Item("image", pixels, grid, grid[1] * grid[2] // s.pixels.merge_size**2, feature_hash(pixels, grid))

    def _video(self, video, n: int, where: str) -> _Item:
        sampling = self.settings.video
        if isinstance(video, dict):
            if "video" not in video:
                raise ValueError(f"video {n}{where}: a video dict needs the key 'video' (path or bytes), got {sorted(video)}")
            sampling = sampling.with_overrides({k: v for k, v in video.items() if k != "video"})
            video = video["video"]
        if not isinstance(video, (str, bytes, bytearray)) and not hasattr(video, "__fspath__"):
            raise TypeError(f"video {n}{where} must be a path, bytes or a dict with 'video', got {type(video).__name__}")
        s = self.settings
        frames = sample_video(video, sampling)
        pixels, grid = improc.preprocess_frames(frames, s.video_min_pixels, s.video_max_pixels, s.pixels)
        length = grid[0] // 2 * grid[1] * grid[2] // s.pixels.merge_size**2  # frame pairs x merge blocks
        return _Item("video", pixels, grid, length, feature_hash(pixels, grid))

    # ---- placing ------------------------------------------------------------------------------------
    def _place(self, ids: list[int], marks: list[tuple], items: list[_Item], index: Optional[int]):
        """Expand each mark to its item's length: (ids, token_type_ids [n] int64, features)."""
        where = "" if index is None else f" (prompt {index})"
        out, types, features, cursor = [], [], [], 0
        for (start, run, modality), item in zip(marks, items):
            if run not in (1, item.length):
                raise ValueError(f"{modality} placeholder run of {run} tokens at {start}{where} does not match the "
                                 f"{modality}'s {item.length} tokens (grid {item.grid_thw}): give one placeholder or {item.length}")
            out.extend(ids[cursor:start])
            types.extend([0] * (start - cursor))
            features.append(MultiModalFeature(modality, len(out), item.length, item.pixel_values, item.grid_thw,
                                              item.mm_hash))
            out.extend([ids[start]] * item.length)
            types.extend([TOKEN_TYPE[modality]] * item.length)
            cursor = start + run
        out.extend(ids[cursor:])
        types.extend([0] * (len(ids) - cursor))
        return out, np.asarray(types, dtype=np.int64), features


def check_against_model(settings: VLSettings, hf_config: dict) -> None:
    """ValueError when the preprocessor's patch or merge size differs from the vision tower's (config.json
    `vision_config.patch_size` / `spatial_merge_size`, or a flat config's `spatial_conv_size`)."""
    vision = vision_config(hf_config)
    for setting, model_value, model_key in (("patch_size", vision.patch_size, "patch_size"),
                                            ("merge_size", vision.spatial_merge_size, "spatial_merge_size")):
        value = getattr(settings.pixels, setting)
        if value != model_value:
            raise ValueError(f"the image processor's {setting}={value} ({settings.source(setting)}) differs from "
                             f"config.json's vision {model_key}={model_value}: the processor and the vision tower "
                             "must agree")
    if vision.in_channels != 3:
        raise ValueError(f"config.json's vision in_channels={vision.in_channels}: the image processor gives RGB (3)")


def feature_hash(pixel_values: np.ndarray, grid_thw: tuple) -> str:
    """sha256 hex of the item's grid and float32 patch bytes (equal pixels and grid -> equal hash)."""
    h = hashlib.sha256(np.asarray(grid_thw, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(pixel_values, dtype=np.float32).tobytes())
    return h.hexdigest()


def mrope_positions(token_type_ids: np.ndarray, features: list[MultiModalFeature], merge: int = 2) -> np.ndarray:
    """[3, n] int64 (t, h, w) positions of a prompt (module docstring's rule; `merge`: the merge size,
    the side of the patch blocks one placeholder stands for)."""
    n = len(token_type_ids)
    positions = np.empty((3, n), dtype=np.int64)
    cursor, p = 0, 0
    for feature in sorted(features, key=lambda f: f.offset):
        text = feature.offset - cursor
        positions[:, cursor:feature.offset] = p + np.arange(text)
        p += text
        t, h, w = feature.grid_thw
        pairs = 1 if feature.modality == "image" else t // 2
        ti, r, c = np.meshgrid(np.arange(pairs), np.arange(h // merge), np.arange(w // merge), indexing="ij")
        block = np.stack([ti.reshape(-1), r.reshape(-1), c.reshape(-1)]) + p  # [3, length]
        positions[:, feature.offset:feature.offset + feature.length] = block
        p = int(block.max()) + 1
        cursor = feature.offset + feature.length
    positions[:, cursor:] = p + np.arange(n - cursor)
    return positions
