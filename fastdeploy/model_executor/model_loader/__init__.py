"""Model loading: resolve the `model=` argument, then open it by format (HF directory or GGUF)."""
from pathlib import Path

from fastdeploy.model_executor.model_loader.model_path import resolve_model_path
from fastdeploy.model_executor.model_loader.source import ModelSource


def open_model(model) -> tuple[str, ModelSource]:
    """(resolved local path, ModelSource) for a directory, a .gguf file, a cached HF name or None."""
    path = Path(resolve_model_path(model))
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model file {path} is not a .gguf file; pass a .gguf file or a model directory")
        from fastdeploy.model_executor.model_loader.gguf_loader import open_gguf

        return str(path), open_gguf(path)
    from fastdeploy.model_executor.model_loader.hf_loader import open_hf_dir

    return str(path), open_hf_dir(path)
