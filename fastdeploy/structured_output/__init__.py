"""Structured outputs: a request's JSON schema, regex, choice or grammar enforced by masking the
logits of every token that would break it (manager.py: the engine's side; the mask is applied by the
sampler, model_executor/layers/sample/token_bitmask.py)."""
from fastdeploy.structured_output.manager import StructuredOutputManager

__all__ = ["StructuredOutputManager"]
