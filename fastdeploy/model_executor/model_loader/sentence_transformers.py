"""A sentence-transformers model directory's pipeline: `modules.json` and its Pooling module's config.

Both layouts in use are read: the hub's (`sentence_transformers.models.Pooling`, whose
`1_Pooling/config.json` sets `pooling_mode_cls_token`, `pooling_mode_mean_tokens`, `pooling_mode_lasttoken`
... flags) and the newer module paths (`sentence_transformers.sentence_transformer.modules.pooling.Pooling`
and `...modules.normalize.Normalize`, a `pooling_mode` string). `sentence_bert_config.json`'s
`max_seq_length` is the length the model was trained to (sentence-transformers truncates there).
"""
from __future__ import annotations

import json
import os
from typing import Optional

# sentence-transformers pooling modes -> the pooler's types (config.py POOLING_TYPES)
POOLING_MODES = {"cls": "CLS", "cls_token": "CLS", "mean": "MEAN", "mean_tokens": "MEAN",
                 "lasttoken": "LAST", "last_token": "LAST"}
SUPPORTED_MODULES = ("Transformer", "Pooling", "Normalize")


def read_sentence_transformers(model_dir: str) -> Optional[dict]:
    """{"pooling_type": "CLS" | "MEAN" | "LAST" | None, "normalize": bool, "max_seq_length": int | None} from a
    sentence-transformers directory, or None when it has no modules.json. ValueError naming a module or pooling
    mode the engine does not implement (e.g. Dense projections, max pooling)."""
    path = os.path.join(model_dir, "modules.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        modules = json.load(f)
    result = {"pooling_type": None, "normalize": False, "max_seq_length": _max_seq_length(model_dir)}
    for module in modules:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind not in SUPPORTED_MODULES:
            raise ValueError(f"{path}: module {module.get('type')!r} is not supported (supported: "
                             f"{list(SUPPORTED_MODULES)})")
        if kind == "Pooling":
            result["pooling_type"] = _pooling_type(os.path.join(model_dir, module.get("path", ""), "config.json"))
        elif kind == "Normalize":
            result["normalize"] = True
    return result


def _pooling_type(config_path: str) -> str:
    with open(config_path) as f:
        config = json.load(f)
    if "pooling_mode" in config:  # the newer layout: one string
        modes = [config["pooling_mode"]]
    else:  # the hub's layout: one flag per mode
        modes = [key[len("pooling_mode_"):] for key, on in config.items() if key.startswith("pooling_mode_") and on]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise ValueError(f"{config_path}: pooling mode {modes} is not supported; supported: one of "
                         f"{sorted(set(POOLING_MODES))}")
    return POOLING_MODES[modes[0]]


def _max_seq_length(model_dir: str) -> Optional[int]:
    path = os.path.join(model_dir, "sentence_bert_config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        value = json.load(f).get("max_seq_length")
    return int(value) if value else None
