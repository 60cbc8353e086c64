"""Which runner an engine gets ("generate" or "pooling") and, for pooling, its PoolerConfig: decided once at
engine start from `LLM(runner=, convert=, task=, pooler_config= / override_pooler_config=)`, the
architecture, and the checkpoint's sentence-transformers files (vLLM's and FastDeploy's rules).

- runner "auto": pooling when `task` is a pooling task, the architecture is an encoder or a pooling
  spelling (`*ForSequenceClassification`, `*Model`), or the directory holds a sentence-transformers
  `modules.json`; else generate.
- the pooling task (`convert`; "auto": from `task`, else by architecture): classify for
  `*ForSequenceClassification`, else embed. `task="score"` runs classify on a cross-encoder and embed
  (cosine of embeddings) on any other model.
- pooling type: the user's pooler_config, else sentence-transformers' Pooling module, else CLS for
  encoders and LAST for decoders (vLLM's defaults); reward always pools ALL. normalize: the user's, else
  whether sentence-transformers' pipeline has a Normalize module, else True.
"""
from __future__ import annotations

from typing import Optional

from fastdeploy.config import ENCODER_ARCHITECTURES, POOLING_TASKS, POOLING_TYPES, PoolerConfig, check_keys
from fastdeploy.model_executor.model_loader.sentence_transformers import read_sentence_transformers

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none") + POOLING_TASKS
TASKS = ("auto", "generate", "embed", "classify", "score", "reward")
POOLER_KEYS = ("pooling_type", "normalize", "activation", "softmax", "dimensions")


def check_pooling_args(runner: str, convert: str, task: str, pooler_config: Optional[dict]) -> None:
    """The settings' own checks (before the model is read): ValueError naming the field and the allowed values."""
    for name, value, allowed in (("runner", runner, RUNNERS), ("convert", convert, CONVERTS), ("task", task, TASKS)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    if runner == "generate" and (task not in ("auto", "generate") or convert not in ("auto", "none")):
        raise ValueError(f"runner='generate' cannot run task={task!r} / convert={convert!r}: pooling tasks need "
                         "runner='pooling' (or 'auto')")
    if task == "generate" and (runner == "pooling" or convert not in ("auto", "none")):
        raise ValueError(f"task='generate' conflicts with runner={runner!r}, convert={convert!r}")
    if pooler_config is None:
        return
    check_keys("pooler_config", pooler_config, POOLER_KEYS)
    kind = pooler_config.get("pooling_type")
    if kind is not None and str(kind).upper() not in POOLING_TYPES:
        raise ValueError(f"pooler_config pooling_type must be one of {list(POOLING_TYPES)}, got {kind!r}")
    for key in ("normalize", "activation", "softmax"):
        if pooler_config.get(key) is not None and not isinstance(pooler_config[key], bool):
            raise TypeError(f"pooler_config {key} must be True or False, got {pooler_config[key]!r}")
    dims = pooler_config.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
        raise ValueError(f"pooler_config dimensions must be an int >= 1, got {dims!r}")


def resolve_pooler(runner: str, convert: str, task: str, hf_config: dict, model_dir: Optional[str],
                   pooler_config: Optional[dict]) -> Optional[PoolerConfig]:
    """The PoolerConfig of the model of config.json `hf_config` in `model_dir` when it runs as a pooling model,
    None when it generates (module docstring's rules). ValueError for a pooling-only architecture under
    runner="generate"."""
    architecture = (hf_config.get("architectures") or [""])[0]
    st = read_sentence_transformers(model_dir) if model_dir else None
    encoder = architecture in ENCODER_ARCHITECTURES
    pooling_spelling = encoder or architecture.endswith(("ForSequenceClassification", "Model"))
    wants_pooling = task not in ("auto", "generate") or convert not in ("auto", "none")
    if runner == "auto":
        runner = "pooling" if wants_pooling or pooling_spelling or st is not None else "generate"
    if runner == "generate":
        if pooling_spelling:
            raise ValueError(f"{architecture} is a pooling model (embeddings, classification), not a generative "
                             "one: use LLM(model, runner='pooling') and LLM.embed / classify / score")
        return None
    return _pooler(_pooling_task(convert, task, architecture), encoder, st, pooler_config or {}, hf_config)


def _pooling_task(convert: str, task: str, architecture: str) -> str:
    classifier = architecture.endswith("ForSequenceClassification")
    from_task = {"embed": "embed", "classify": "classify", "reward": "reward",
                 "score": "classify" if classifier else "embed"}.get(task)
    if convert not in ("auto", "none"):
        if from_task is not None and from_task != convert and not (task == "score" and convert == "embed"):
            raise ValueError(f"task={task!r} conflicts with convert={convert!r}")
        return convert
    if from_task is not None:
        return from_task
    return "classify" if classifier else "embed"


def _pooler(task: str, encoder: bool, st: Optional[dict], user: dict, hf_config: dict) -> PoolerConfig:
    st = st or {}
    default_type = st.get("pooling_type") or ("CLS" if encoder else "LAST")
    pooling_type = str(user.get("pooling_type") or default_type).upper()
    if task == "reward":
        pooling_type = "ALL"
    elif pooling_type == "ALL":
        raise ValueError(f"pooling_type 'ALL' gives one vector per token; task {task!r} needs one per prompt "
                         f"({[t for t in POOLING_TYPES if t != 'ALL']})")
    activation = user.get("activation", user.get("softmax"))
    return PoolerConfig(
        task=task,
        pooling_type=pooling_type,
        normalize=user.get("normalize", st.get("normalize", True)),
        activation=True if activation is None else activation,
        dimensions=user.get("dimensions"),
        matryoshka_dimensions=matryoshka_dimensions(hf_config),
        max_seq_length=st.get("max_seq_length"),
    )


def matryoshka_dimensions(hf_config: dict) -> Optional[tuple]:
    """The Matryoshka sizes config.json declares: a tuple of `matryoshka_dimensions`, None for
    `is_matryoshka` without a list (any size), () when it declares none (truncation refused)."""
    dims = hf_config.get("matryoshka_dimensions")
    if dims:
        return tuple(int(d) for d in dims)
    return None if hf_config.get("is_matryoshka") else ()


def classifier_token_ids(hf_config: dict, tokenizer) -> dict:
    """config.json with `classifier_token_ids` added when it names `classifier_from_token` (the
    Qwen3-Reranker form, models/pooling_adapters.py): each token's id in the tokenizer's vocabulary;
    ValueError naming a token the vocabulary lacks."""
    tokens = hf_config.get("classifier_from_token")
    if not tokens:
        return hf_config
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"classifier_from_token must be a list of token strings, got {tokens!r}")
    ids = []
    for token in tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"classifier_from_token names {token!r}, which is not a token of the vocabulary")
        ids.append(int(token_id))
    return {**hf_config, "classifier_token_ids": ids}
