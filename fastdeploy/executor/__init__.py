"""Executors: the seam between the engine and the model runner(s)."""
from fastdeploy.executor.abstract import Executor
from fastdeploy.executor.in_process import InProcessExecutor
from fastdeploy.executor.multiproc import MultiprocExecutor

__all__ = ["Executor", "InProcessExecutor", "MultiprocExecutor"]
