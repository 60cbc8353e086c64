"""Logits processors (FastDeploy's `fastdeploy.model_executor.logits_processor`): the interface
(base.py), the built-ins (builtin.py), and loading the classes `LLM(logits_processors=[...])` names.

A spec is a bare class name of this package (a built-in) or "package.module:ClassName". The classes
are loaded when the LLM is built (EngineArgs: bad specs raise there, with FastDeploy's messages),
again by the input processor (each class's `validate_params`), and instantiated once by the model
runner that samples (`build_logits_processors`); the FDConfig holds the specs as plain strings, so
it pickles to tensor-parallel workers.
"""
from __future__ import annotations

import inspect
from importlib import import_module

from fastdeploy.model_executor.logits_processor.base import LogitsProcessor, LogitsRow, apply_processors
from fastdeploy.model_executor.logits_processor.builtin import LogitBiasLogitsProcessor

BUILTIN_MODULE = "fastdeploy.model_executor.logits_processor"


def load_class(spec: str) -> type:
    """The class `spec` names. ValueError: not "Name" or "module:Name"; ImportError: the module
    does not import; AttributeError: it has no such attribute; TypeError: not a concrete class with
    update_state and apply."""
    if not isinstance(spec, str):
        raise TypeError(f"logits_processors entries must be str, got {spec!r} ({type(spec).__name__})")
    module_path, _, class_name = spec.rpartition(":") if ":" in spec else (BUILTIN_MODULE, "", spec)
    if not module_path or not class_name.isidentifier() or ":" in module_path:
        raise ValueError(f"Invalid spec {spec!r}; expected 'module:ClassName'.")
    try:
        module = import_module(module_path)
    except ImportError as error:
        raise ImportError(f"Failed to import module {module_path} (logits processor {spec!r}): {error}") from error
    try:
        cls = getattr(module, class_name)
    except AttributeError:
        raise AttributeError(f"Module {module_path} does not have attribute {class_name}") from None
    if not isinstance(cls, type) or inspect.isabstract(cls) or not all(
            callable(getattr(cls, name, None)) for name in ("update_state", "apply")):
        raise TypeError(f"logits processor {spec!r} must be a concrete class with update_state(rows) and "
                        "apply(logits) (see fastdeploy.model_executor.logits_processor.LogitsProcessor)")
    return cls


def build_logits_processors(fd_config) -> list:
    """One instance per spec of `fd_config.logits_processors`, in order (the order they run in)."""
    return [load_class(spec)(fd_config) for spec in fd_config.logits_processors]


__all__ = ["LogitsProcessor", "LogitsRow", "LogitBiasLogitsProcessor", "apply_processors", "build_logits_processors",
           "load_class"]
