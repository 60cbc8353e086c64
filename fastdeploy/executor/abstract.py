"""The interface between the engine and whatever runs the model.

The engine talks to an `Executor` only: it hands over a pickleable `SchedulerOutput` each step and
gets a pickleable `ModelRunnerOutput` back. `InProcessExecutor` runs one model runner in the
engine's process; a multiprocess executor (tensor parallelism: one worker process per rank, each
opening the checkpoint from `fd_config.model_path` and loading its shard) implements the same four
methods, sending the SchedulerOutput to every rank and returning the sampling rank's output.
An executor whose `max_concurrent_batches` is above 1 (pipeline stages) also has `submit(so)`,
`collect()` and `drop_in_flight()`: the engine keeps up to that many steps in flight.
"""
from __future__ import annotations

import abc

from fastdeploy.engine.sched.output import SchedulerOutput
from fastdeploy.worker.output import ModelRunnerOutput


class Executor(abc.ABC):
    max_concurrent_batches = 1  # steps the engine may have in flight (pipeline stages)

    @abc.abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step on every worker; the sampled tokens (sampling happens once, on rank 0).
        Raises whatever the model raised; the engine then rolls the step back."""

    @abc.abstractmethod
    def check_health(self) -> None:
        """Raise RuntimeError naming the failed worker, or return None when all are alive."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release the workers and their memory; idempotent."""
