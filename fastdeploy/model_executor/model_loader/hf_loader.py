"""Open a Hugging Face layout directory: config.json, safetensors (+ index), tokenizer, templates."""
import json
import logging
from pathlib import Path
from typing import Iterator

import numpy as np
import paddle

from fastdeploy.model_executor.model_loader.paddle_layout import (
    is_paddle_layout,
    paddle_config_to_hf,
    paddle_to_hf_weights,
)
from fastdeploy.model_executor.model_loader.source import ModelSource

logger = logging.getLogger(__name__)


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint's shards: from model.safetensors.index.json if present, else *.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(_read_json(index)["weight_map"].values()))
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists shards that are missing: {missing}")
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    return files


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (name, float32 array) one at a time; bf16/fp16 checkpoints are upcast.

    safetensors' paddle reader is used because numpy has no bfloat16.
    """
    from safetensors import safe_open

    for path in files:
        with safe_open(str(path), framework="paddle") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                if tensor.dtype != paddle.float32:
                    tensor = tensor.astype("float32")
                yield name, np.from_dlpack(tensor)  # a view: no second copy of the tensor


def open_hf_dir(model_dir: Path) -> ModelSource:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{model_dir} has no config.json: expected a Hugging Face layout directory "
            "(config.json, *.safetensors, tokenizer files) or a .gguf file"
        )
    hf_config = _read_json(config_path)
    gen_path = model_dir / "generation_config.json"
    generation_config = _read_json(gen_path) if gen_path.is_file() else {}
    files = safetensors_files(model_dir)
    weights = lambda: iter_safetensors(files)  # noqa: E731
    if is_paddle_layout(hf_config):  # FastDeploy's -Paddle repos: ernie./qwen2. names, [in, out], fused qkv
        logger.info("%s is a Paddle-layout checkpoint; reading it as Hugging Face names", model_dir)
        hf_config = paddle_config_to_hf(hf_config)
        weights = lambda: paddle_to_hf_weights(iter_safetensors(files), hf_config)  # noqa: E731
    return ModelSource(
        hf_config=hf_config,
        generation_config=generation_config,
        path=model_dir,
        weights=weights,
    )
