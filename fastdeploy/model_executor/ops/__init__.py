"""Import shims for the custom ops: each picks the compiled op (custom_ops/) or its pure-Paddle fallback."""
from fastdeploy.model_executor.ops.loader import compiled_op, compiled_ops, fallbacks_forced

__all__ = ["compiled_op", "compiled_ops", "fallbacks_forced"]
