"""FastDeploy's "Paddle layout" checkpoints (the `-Paddle` repos, e.g. baidu/ERNIE-4.5-0.3B-Paddle,
baidu/ERNIE-4.5-21B-A3B-Paddle) read as Hugging Face names and orientations.

Facts from upstream FastDeploy 2.x (github.com/PaddlePaddle/FastDeploy, as mirrored by
lizhenyun01/FastDeploy at cb56d46):

- Telling the layouts apart, `fastdeploy/config.py` `ModelConfig.read_model_config`: from
  config.json alone, "torch_dtype" -> model_format "torch" (Hugging Face layout), "dtype" ->
  "paddle", both -> ValueError, neither -> ValueError. (The env var FD_FOR_TORCH_MODEL_FORMAT
  forces "torch" in `FDConfig.__init__`.)
- Orientation: a Paddle linear weight is [in, out]; torch's is [out, in]. FastDeploy transposes
  only when model_format == "torch": `layers/linear.py` (UnquantizedLinearMethod), `layers/lm_head.py`
  (`weight_need_transpose`), `layers/moe/fused_moe_backend_base.py` (experts [E, hidden, 2*inter]
  for paddle). The embedding is [vocab, hidden] in both; norms, biases and
  `moe_statics.e_score_correction_bias` ([1, experts]) are the same in both.
- ERNIE-4.5 names (`models/ernie4_5_moe.py`; `tests/e2e/EB_VL_Lite/baseline.txt` lists checkpoint
  names): the base prefix is `ernie.` (HF: `model.`; FastDeploy's loader does
  `name.replace("model", "ernie")`, so `model.` is read too). Attention is fused:
  `self_attn.qkv_proj.weight` [hidden, q + 2*kv], columns [all q heads | all k heads | all v heads]
  (`layers/linear.py` QKVParallelLinear.weight_loader with shard_id None;
  `models/tp_utils.py` gqa_qkv_split_func). The MLP is fused: `mlp.up_gate_proj.weight`
  [hidden, 2*inter], columns [gate | up] (MergedColumnParallelLinear.weight_loader; FusedMoE's
  `paddle.concat([gate, up], axis=-1)` in `layers/moe/moe.py`); likewise per expert
  `mlp.experts.{e}.up_gate_proj.weight` and `mlp.shared_experts.up_gate_proj.weight`;
  `down_proj.weight` [inter, hidden]. The router `mlp.gate.weight` is [hidden, experts] (a
  ReplicatedLinear). `mlp.moe_statics.e_score_correction_bias` keeps its HF name. `lm_head.weight`
  is [hidden, vocab] (absent when tied); `lm_head.bias` [vocab] (`layers/lm_head.py` bias_key).
  RoPE is the same interleaved style in both layouts (`use_neox_rotary_style=False` whatever the
  format), so q/k rows need no reordering here.
  The MoE repos also carry the MTP draft head (`ernie.mtp_block.*`, `ernie.mtp_emb_norm.*`,
  `ernie.mtp_hidden_norm.*`, `ernie.mtp_linear_proj.*`, `models/ernie4_5_mtp.py`), which the main
  model's loader skips; we skip it too. FastDeploy registers `Ernie4_5_ForCausalLM` (the
  architecture of the dense `-Paddle` configs and of the first `-PT` ones) as an alias of
  `Ernie4_5ForCausalLM`; `paddle_config_to_hf` maps it so our registry finds the model.
- ERNIE-4.5-VL (`models/ernie4_5_vl/ernie4_5_vl_moe.py` and its `weight_infos` / `weight_vison`):
  the decoder as above with modality-isolated experts `mlp.experts.{0..2E-1}` (text then vision), the
  routers `mlp.gate.weight` (text) and `mlp.gate.weight_1` (vision) [hidden, E] -- already so in the
  PT layout, so kept as they are -- and `mlp.moe_statics.e_score_correction_bias` [2, E]; the vision
  tower under `vision_model.` (no base prefix: patch_embed.proj, blocks.{j}.{norm1, norm2, attn.qkv,
  attn.proj, mlp.fc1, mlp.fc2}, ln) and the resampler under `ernie.resampler_model.` (or
  `resampler_model.`), their 2-D weights [in, out] like every Paddle linear weight.
- Qwen (`models/qwen2.py`, `qwen3.py`, `qwen3moe.py`): the Paddle layout keeps the HF names
  unfused (q/k/v_proj, gate/up_proj, per-expert gate/up/down_proj) with [in, out] linear weights;
  the Qwen2 base prefix is `qwen2.` (FastDeploy maps HF's `model.` to `qwen2.` only for torch
  format), Qwen3 / Qwen3-MoE keep `model.`. FastDeploy 2.x has no Llama model, so no Llama Paddle
  layout; a `model.`-prefixed [in, out] Llama checkpoint would still be read by the same rules.

The rule implemented (`is_paddle_layout`), and why it differs from FastDeploy's: transformers 5
writes "dtype" instead of "torch_dtype" into config.json, so FastDeploy's rule would call every
checkpoint saved by a current transformers -- ours included -- a Paddle one. transformers always
writes "transformers_version" into config.json; the Paddle side never does: PaddleFormers'
`PretrainedConfig.to_dict` (paddleformers/transformers/configuration_utils.py) writes "dtype" and
"paddleformers_version", and "torch_dtype" instead of "dtype" when it exports for Hugging Face.
So: Paddle layout iff "dtype" is present and neither "torch_dtype" nor "transformers_version" is.
Where FastDeploy raises (both keys, or neither) we read the Hugging Face layout, as before this
module existed. (A hand-edited HF config that lost "transformers_version" would be misread as
Paddle; the loader's shape checks then reject every non-square linear weight.)

`paddle_to_hf_weights` turns the stream into (HF name, HF-oriented array) pairs one tensor at a
time: transposes are numpy views and fused tensors are split into views, so loading still never
holds a second copy of the model. A name it cannot map raises ValueError naming the tensor.
"""
import re
from typing import Iterable, Iterator

import numpy as np

# Base-model prefixes of the Paddle layout (FastDeploy's `prefix_name`s), read as HF's `model.`.
PADDLE_PREFIXES = ("ernie.", "qwen2.", "model.")
# Paddle architecture names that our registry knows under their HF name.
ARCHITECTURE_ALIASES = {"Ernie4_5_ForCausalLM": "Ernie4_5ForCausalLM"}
# Tensors of the Paddle layout with no HF counterpart, skipped on purpose: ERNIE's MTP draft head.
_SKIPPED = re.compile(r"^(ernie|model)\.mtp_")

_PROJ = r"(?:q|k|v|o)_proj"
_MLP = r"mlp(?:\.shared_experts|\.experts\.\d+)?"
# layer-relative Paddle name -> how it becomes HF: "same" (name and array unchanged), "linear"
# (name unchanged, [in, out] -> [out, in]), "qkv" / "up_gate" (split, weights transposed)
_LAYER_RULES = [
    (re.compile(r"(?:input_layernorm|post_attention_layernorm)\.weight"), "same"),
    (re.compile(r"self_attn\.(?:q_norm|k_norm)\.weight"), "same"),
    (re.compile(rf"self_attn\.{_PROJ}\.weight"), "linear"),
    (re.compile(rf"self_attn\.{_PROJ}\.bias"), "same"),
    (re.compile(r"self_attn\.qkv_proj\.(?:weight|bias)"), "qkv"),
    (re.compile(rf"{_MLP}\.(?:gate_proj|up_proj|down_proj)\.weight"), "linear"),
    (re.compile(rf"{_MLP}\.(?:gate_proj|up_proj|down_proj)\.bias"), "same"),
    (re.compile(rf"{_MLP}\.up_gate_proj\.(?:weight|bias)"), "up_gate"),
    (re.compile(r"mlp\.gate\.weight"), "linear"),
    (re.compile(r"mlp\.moe_statics\.e_score_correction_bias"), "same"),
]
_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
# ERNIE-4.5-VL's encoder parts, with or without the base prefix
_VISION = re.compile(r"^(?:ernie\.|model\.)?(vision_model\.|resampler_model\.)")
_ROUTER = re.compile(r"^(?:ernie|model)\.layers\.\d+\.mlp\.gate\.weight(?:_1)?$")


def is_paddle_layout(hf_config: dict) -> bool:
    """Whether config.json describes a Paddle-layout checkpoint (see the module docstring).

    FastDeploy (fastdeploy/config.py, ModelConfig.read_model_config): "dtype" without
    "torch_dtype" means Paddle. We also require the absence of "transformers_version", which
    transformers writes, so that the "dtype" of a transformers-5 config stays Hugging Face layout.
    """
    return "dtype" in hf_config and "torch_dtype" not in hf_config and "transformers_version" not in hf_config


def paddle_config_to_hf(hf_config: dict) -> dict:
    """config.json of a Paddle-layout checkpoint as our registry reads it (architecture aliases)."""
    config = dict(hf_config)
    architectures = config.get("architectures")
    if architectures:
        config["architectures"] = [ARCHITECTURE_ALIASES.get(a, a) for a in architectures]
    return config


def _split_sizes(hf_config: dict) -> tuple[int, int]:
    """(q columns, k/v columns) of a fused qkv_proj."""
    heads = hf_config["num_attention_heads"]
    kv_heads = hf_config.get("num_key_value_heads") or heads
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    return heads * head_dim, kv_heads * head_dim


def paddle_to_hf_weights(weights: Iterable[tuple[str, np.ndarray]],
                         hf_config: dict) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (HF name, HF-layout array) for each (Paddle name, Paddle-layout array) of `weights`.

    Raises ValueError naming the tensor for a name with no HF counterpart, or a fused tensor whose
    width does not match the config.
    """
    q_size, kv_size = _split_sizes(hf_config)
    multimodal = "vision_config" in hf_config  # ERNIE-4.5-VL: routers stay [hidden, E]
    for name, array in weights:
        if _SKIPPED.match(name):
            continue
        encoder = _VISION.match(name)
        if encoder:  # vision tower and resampler: 2-D weights are linear [in, out], the rest as is
            yield f"model.{encoder.group(1)}{name[encoder.end():]}", _linear(name, array) if array.ndim == 2 else array
        elif multimodal and _ROUTER.search(name):
            yield f"model.{name.split('.', 1)[1]}", array
        else:
            yield from _convert(name, array, q_size, kv_size)


def _unmappable(name: str, why: str) -> ValueError:
    return ValueError(f"Paddle-layout checkpoint tensor {name!r} {why}; cannot map it to a Hugging Face name")


def _linear(name: str, array: np.ndarray) -> np.ndarray:
    if array.ndim != 2:
        raise _unmappable(name, f"is a linear weight of shape {list(array.shape)}, expected 2 dimensions")
    return array.T  # [in, out] -> [out, in], a view


def _convert(name: str, array: np.ndarray, q_size: int, kv_size: int):
    if name == "lm_head.weight":
        yield name, _linear(name, array)
        return
    if name == "lm_head.bias":  # ParallelLMHead's bias_key (ERNIE-4.5-MoE with use_bias)
        yield name, array
        return
    prefix = next((p for p in PADDLE_PREFIXES if name.startswith(p)), None)
    if prefix is None:
        raise _unmappable(name, f"has none of the base prefixes {list(PADDLE_PREFIXES)}")
    rest = name[len(prefix):]
    if rest in ("embed_tokens.weight", "norm.weight"):
        yield "model." + rest, array
        return
    layer = _LAYER.fullmatch(rest)
    kind = None
    if layer is not None:
        kind = next((k for pattern, k in _LAYER_RULES if pattern.fullmatch(layer.group(2))), None)
    if kind is None:
        raise _unmappable(name, "is not a known parameter of the Paddle layout")
    base = f"model.layers.{layer.group(1)}."
    inner = layer.group(2)
    if kind == "same":
        yield base + inner, array
    elif kind == "linear":
        yield base + inner, _linear(name, array)
    elif kind == "qkv":
        # columns [q | k | v] (FastDeploy QKVParallelLinear.weight_loader)
        width = array.shape[-1]
        if width != q_size + 2 * kv_size:
            raise _unmappable(name, f"has {width} fused q/k/v columns, config implies {q_size} + 2 x {kv_size}")
        suffix = inner.rsplit(".", 1)[1]
        bounds = {"q_proj": (0, q_size), "k_proj": (q_size, q_size + kv_size),
                  "v_proj": (q_size + kv_size, q_size + 2 * kv_size)}
        for proj, (a, b) in bounds.items():
            part = array[..., a:b]
            yield f"{base}self_attn.{proj}.{suffix}", _linear(name, part) if suffix == "weight" else part
    else:  # up_gate: columns [gate | up] (FastDeploy MergedColumnParallelLinear.weight_loader)
        width = array.shape[-1]
        if width % 2:
            raise _unmappable(name, f"has an odd number ({width}) of fused gate/up columns")
        mlp, suffix = inner.rsplit(".up_gate_proj.", 1)
        half = width // 2
        for proj, part in (("gate_proj", array[..., :half]), ("up_proj", array[..., half:])):
            yield f"{base}{mlp}.{proj}.{suffix}", _linear(name, part) if suffix == "weight" else part
