"""Executors: the seam between the engine and the model runner(s)."""
from fastdeploy.executor.abstract import Executor
from fastdeploy.executor.in_process import InProcessExecutor

__all__ = ["Executor", "InProcessExecutor"]
