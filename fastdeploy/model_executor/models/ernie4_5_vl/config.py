"""ERNIE-4.5-VL's config.json in either of its two formats, normalised to one struct (`VLConfig`).

- Hugging Face (transformers' `ernie4_5_vl_moe`, what `save_pretrained` writes): nested `text_config`
  and `vision_config`; `text_config.rope_parameters.mrope_section` = [h, w, t] frequency sections;
  `moe_num_experts` one number for both modalities; `moe_intermediate_size` [text, vision];
  `mlp_layer_types` ("dense" / "sparse" per layer); six token ids at the top level.
- FastDeploy / PaddleFormers (flat; the `-Paddle` and first `-PT` repos): text keys at the top level,
  `im_patch_id` (the placeholder of images and videos), `moe_num_experts` [text, vision] or one
  number, `moe_layer_start_index` / `moe_layer_end_index` (int or [text, vision]) and
  `moe_layer_interval`, `freq_allocation` (the t section; h = w = the rest split in two),
  `spatial_conv_size`, `temporal_conv_size`, and `vision_config` {depth, embed_dim or hidden_size,
  num_heads, mlp_ratio, hidden_act, patch_size, in_channels}.
The six special token ids (`VLTokenIds`) have one source, `token_ids(config, tokenizer)`, read by
the model (routing to the vision experts) and the input processor (placement) alike:
- nested: config.json's keys, else transformers' defaults (what transformers' model uses: its
  config class fills them; ERNIE-4.5-VL's vocabulary);
- flat: `im_patch_id` (or `image_token_id`) for images and videos alike (FastDeploy has no video
  placeholder; `video_token_id` when present), the delimiters from their HF key names when present,
  else the tokenizer's `<|IMAGE_PLACEHOLDER|>`, `<|IMAGE_START|>`, ... tokens (FastDeploy reads them
  there); ValueError naming the key and the token when both lack an id.
The engine resolves them once with the checkpoint's tokenizer (`with_token_ids`) and keeps the
completed config.json, so the model, built from the config alone, and the processor agree.
Layer i of a flat config is sparse when (i + 1) % interval == 0 and start <= i <= end (the HF
converter's rule); text and vision ranges must agree (FastDeploy also runs a dense vision MLP
outside a narrower vision range, which transformers cannot express; refused here).
Source: transformers 5.23 configuration_ernie4_5_vl_moe.py, FastDeploy 2.3 ernie4_5_vl_moe.py.
"""
from __future__ import annotations

from dataclasses import dataclass

# VLTokenIds field -> (config.json key, tokenizer token, transformers' Ernie4_5_VLMoeConfig default)
TOKEN_SOURCES = {
    "image": ("image_token_id", "<|IMAGE_PLACEHOLDER|>", 100295),
    "image_start": ("image_start_token_id", "<|IMAGE_START|>", 101304),
    "image_end": ("image_end_token_id", "<|IMAGE_END|>", 101305),
    "video": ("video_token_id", "<|VIDEO_PLACEHOLDER|>", 103367),
    "video_start": ("video_start_token_id", "<|VIDEO_START|>", 101306),
    "video_end": ("video_end_token_id", "<|VIDEO_END|>", 101307),
}


@dataclass(frozen=True)
class VLTokenIds:
    """The special ids of an ERNIE-4.5-VL checkpoint (`token_ids`). `video` equals `image` in
    FastDeploy's Paddle checkpoints (they have no video placeholder token)."""

    image: int
    image_start: int
    image_end: int
    video: int
    video_start: int
    video_end: int

    @property
    def vision(self) -> tuple[int, ...]:
        """Ids whose tokens go to the vision experts: placeholders and image/video delimiters."""
        return tuple(sorted({self.image, self.video, self.image_start, self.image_end, self.video_start,
                             self.video_end}))


def _tokenizer_id(tokenizer, token: str):
    """The id of `token` in the tokenizer's vocabulary, or None (no tokenizer, unknown token)."""
    if tokenizer is None:
        return None
    token_id = tokenizer.convert_tokens_to_ids(token)
    return None if token_id is None or token_id == tokenizer.unk_token_id else token_id


def token_ids(hf: dict, tokenizer=None) -> VLTokenIds:
    """The six special ids of config.json `hf` (either format; tokenizer: the checkpoint's, consulted
    for flat configs only). ValueError naming the config key and the token when a flat config's id is
    in neither (or, without a tokenizer, not in the config)."""
    if "text_config" in hf:  # nested: what transformers' config class holds
        return VLTokenIds(**{field: hf.get(key, default) for field, (key, _, default) in TOKEN_SOURCES.items()})

    def resolve(field: str, *config_keys: str) -> int:
        key, token, _ = TOKEN_SOURCES[field]
        for name in config_keys or (key,):
            if hf.get(name) is not None:
                return hf[name]
        found = _tokenizer_id(tokenizer, token)
        if found is None:
            where = f"the tokenizer has no {token} token" if tokenizer is not None else \
                f"no tokenizer was given to look up {token}"
            raise ValueError(f"ERNIE-4.5-VL config.json has no {' / '.join(config_keys or (key,))} and {where}: "
                             "prompts with images or videos need this id")
        return found

    image = resolve("image", "im_patch_id", "image_token_id")
    return VLTokenIds(image=image, image_start=resolve("image_start"), image_end=resolve("image_end"),
                      video=hf["video_token_id"] if hf.get("video_token_id") is not None else image,
                      video_start=resolve("video_start"), video_end=resolve("video_end"))


def with_token_ids(hf: dict, tokenizer) -> dict:
    """config.json `hf` with its resolved `token_ids(hf, tokenizer)` written under their HF key names
    (a new dict), so that `VLConfig.from_hf` of it needs no tokenizer. ValueError as token_ids."""
    ids = token_ids(hf, tokenizer)
    return {**hf, **{key: getattr(ids, field) for field, (key, _, _) in TOKEN_SOURCES.items()}}


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    patch_size: int
    in_channels: int
    spatial_merge_size: int
    temporal_merge_size: int
    hidden_act: str
    layer_norm_eps: float
    rope_theta: float

    @property
    def patch_dim(self) -> int:
        """Values per patch row of pixel_values: channels * patch * patch (588 for 3 x 14 x 14)."""
        return self.in_channels * self.patch_size**2


@dataclass(frozen=True)
class VLConfig:
    vision: VisionConfig
    text_hidden_size: int
    text_rms_norm_eps: float
    mrope_section: tuple[int, int, int]  # (h, w, t) frequency counts, summing to head_dim / 2
    token_ids: VLTokenIds
    num_experts: int  # per modality
    moe_k: int
    moe_intermediate_size: tuple[int, int]  # (text, vision)
    moe_num_shared_experts: int
    moe_norm_min: float
    moe_correction_bias: bool
    sparse_layers: tuple[bool, ...]

    @classmethod
    def from_hf(cls, hf: dict, tokenizer=None) -> "VLConfig":
        """Parse config.json (either format; the tokenizer as `token_ids`). ValueError naming the key
        for a missing or bad one."""
        try:
            return _from_nested(hf) if "text_config" in hf else _from_flat(hf, tokenizer)
        except KeyError as e:
            raise ValueError(f"ERNIE-4.5-VL config.json lacks the required key {e.args[0]!r}") from None


def _vision_nested(vision: dict) -> VisionConfig:
    return VisionConfig(
        depth=vision.get("depth", 32), hidden_size=vision.get("hidden_size", 1280),
        num_heads=vision.get("num_heads", 16),
        intermediate_size=vision.get("intermediate_size", 4 * vision.get("hidden_size", 1280)),
        patch_size=vision.get("patch_size", 14), in_channels=vision.get("in_channels", 3),
        spatial_merge_size=vision.get("spatial_merge_size", 2),
        temporal_merge_size=vision.get("temporal_merge_size", 2),
        hidden_act=vision.get("hidden_act", "quick_gelu"), layer_norm_eps=vision.get("rms_norm_eps", 1e-6),
        rope_theta=(vision.get("rope_parameters") or {}).get("rope_theta", 10000.0))


def _vision_flat(hf: dict) -> VisionConfig:
    vision = hf["vision_config"]
    hidden = vision.get("hidden_size") or vision["embed_dim"]
    return VisionConfig(
        depth=vision["depth"], hidden_size=hidden, num_heads=vision["num_heads"],
        intermediate_size=vision.get("intermediate_size") or int(hidden * vision.get("mlp_ratio", 4)),
        patch_size=vision.get("patch_size", 14), in_channels=vision.get("in_channels", 3),
        spatial_merge_size=hf.get("spatial_conv_size", vision.get("spatial_merge_size", 2)),
        temporal_merge_size=hf.get("temporal_conv_size", 2), hidden_act=vision.get("hidden_act", "quick_gelu"),
        layer_norm_eps=1e-6, rope_theta=10000.0)


def vision_config(hf: dict) -> VisionConfig:
    """The vision tower's settings from config.json `hf` (either format, or the text keys merged to the
    top level as ModelConfig.hf_config holds them). ValueError naming a missing key."""
    try:
        return _vision_nested(hf["vision_config"]) if isinstance(hf.get("text_config"), dict) else _vision_flat(hf)
    except KeyError as e:
        raise ValueError(f"ERNIE-4.5-VL config.json lacks the required key {e.args[0]!r}") from None


def encoder_parameters(hf: dict) -> tuple[list[tuple[int, int]], int]:
    """The vision tower's and resampler's parameters, from config.json `hf` (as vision_config): ([(in_features,
    out_features)] of each linear weight, count of the other values: biases and norm weights). ValueError
    naming a missing key."""
    vision = vision_config(hf)
    try:
        text_hidden = hf["text_config"]["hidden_size"] if isinstance(hf.get("text_config"), dict) else hf["hidden_size"]
    except KeyError as e:
        raise ValueError(f"ERNIE-4.5-VL config.json lacks the required key {e.args[0]!r}") from None
    h, inner = vision.hidden_size, vision.intermediate_size
    spatial = h * vision.spatial_merge_size**2
    block = [(h, 3 * h), (h, h), (h, inner), (inner, h)]  # qkv, proj, fc1, fc2
    resampler = [(spatial, spatial), (spatial, spatial), (spatial * vision.temporal_merge_size, spatial),
                 (spatial, spatial), (spatial, text_hidden)]  # spatial fc1, fc2; temporal fc1, fc2; mlp
    linears = [(vision.patch_dim, h)] + block * vision.depth + resampler
    biases = sum(out for _, out in linears) - h  # the patch embed has none
    norms = vision.depth * 4 * h + 2 * h + 2 * 2 * spatial + text_hidden  # LayerNorms (weight, bias), after_norm
    return linears, biases + norms


def _pair(value) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value, value)


def _from_nested(hf: dict) -> VLConfig:
    text, vision = hf["text_config"], hf["vision_config"]
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    section = tuple((text.get("rope_parameters") or {}).get("mrope_section", [22, 22, 20]))
    layers = text["num_hidden_layers"]
    types = text.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    return _checked(VLConfig(
        vision=_vision_nested(vision),
        text_hidden_size=text["hidden_size"], text_rms_norm_eps=text.get("rms_norm_eps", 1e-5),
        mrope_section=section, token_ids=token_ids(hf),
        num_experts=text.get("moe_num_experts", 64), moe_k=text.get("moe_k", 6),
        moe_intermediate_size=_pair(text.get("moe_intermediate_size", [1536, 512])),
        moe_num_shared_experts=text.get("moe_num_shared_experts", 2), moe_norm_min=text.get("moe_norm_min", 1e-12),
        moe_correction_bias=True, sparse_layers=tuple(t == "sparse" for t in types)), head_dim, layers)


def _from_flat(hf: dict, tokenizer) -> VLConfig:
    vision = hf["vision_config"]
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    t_section = hf.get("freq_allocation", 20)
    hw = head_dim // 2 - t_section
    layers = hf["num_hidden_layers"]
    starts, ends = _pair(hf.get("moe_layer_start_index", 0)), _pair(hf.get("moe_layer_end_index", layers - 1))
    if starts[0] != starts[1] or ends[0] != ends[1]:
        raise ValueError(f"moe_layer_start_index {hf.get('moe_layer_start_index')} / moe_layer_end_index "
                         f"{hf.get('moe_layer_end_index')}: different text and vision MoE layer ranges are not supported")
    end = ends[0] if ends[0] >= 0 else layers - 1
    interval = hf.get("moe_layer_interval", 1)
    experts = _pair(hf.get("moe_num_experts", 64))
    if experts[0] != experts[1]:
        raise ValueError(f"moe_num_experts {list(experts)}: different text and vision expert counts are not supported")
    return _checked(VLConfig(
        vision=_vision_flat(hf),
        text_hidden_size=hf["hidden_size"], text_rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        mrope_section=(hw // 2, hw - hw // 2, t_section), token_ids=token_ids(hf, tokenizer),
        num_experts=experts[0], moe_k=hf.get("moe_k", 6),
        moe_intermediate_size=_pair(hf.get("moe_intermediate_size", [1536, 512])),
        moe_num_shared_experts=hf.get("moe_num_shared_experts", 0), moe_norm_min=hf.get("moe_norm_min", 1e-12),
        moe_correction_bias=hf.get("moe_use_aux_free", True),
        sparse_layers=tuple((i + 1) % interval == 0 and starts[0] <= i <= end for i in range(layers))),
        head_dim, layers)


def _checked(config: VLConfig, head_dim: int, layers: int) -> VLConfig:
    h, w, t = config.mrope_section
    if h != w or h + w + t != head_dim // 2:
        raise ValueError(f"mrope_section {list(config.mrope_section)}: need h == w and h + w + t == head_dim / 2 "
                         f"= {head_dim // 2}")
    if len(config.sparse_layers) != layers:
        raise ValueError(f"mlp_layer_types has {len(config.sparse_layers)} entries, num_hidden_layers is {layers}")
    if config.vision.temporal_merge_size != 2:
        raise ValueError(f"temporal_merge_size {config.vision.temporal_merge_size}: only 2 is supported "
                         "(frames are paired)")
    if config.vision.hidden_act != "quick_gelu":
        raise ValueError(f"vision hidden_act {config.vision.hidden_act!r}: only 'quick_gelu' is supported")
    return config
