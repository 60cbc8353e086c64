"""An executor that runs the single model runner in the engine's own process."""
from __future__ import annotations

from fastdeploy.config import FDConfig
from fastdeploy.engine.sched.output import SchedulerOutput
from fastdeploy.executor.abstract import Executor
from fastdeploy.model_executor.layers.parameters import release_parameters
from fastdeploy.platforms.cpu import return_freed_memory
from fastdeploy.worker.model_runner import ModelRunner
from fastdeploy.worker.output import ModelRunnerOutput


class InProcessExecutor(Executor):
    """Builds the model (kernel choices made now: see docs/design.md) from `weights`, an iterable of
    (checkpoint name, array), and runs it here. `quant_config` describes a quantized checkpoint
    (GGUF block types from its header), or None."""

    def __init__(self, fd_config: FDConfig, weights, quant_config=None):
        from fastdeploy.model_executor.models import get_model_class

        model_config = fd_config.model_config
        model_cls = get_model_class(model_config.architecture, fd_config.pooling_task)
        model = model_cls(model_config, fd_config.cache_config.block_size, fd_config.scheduler_config.max_model_len,
                          quant_config)
        model.load_weights(weights)
        return_freed_memory()  # the load's transient tensors, kept in the heap by reuse_freed_memory
        self.runner = ModelRunner(fd_config, model)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        if self.runner is None:
            raise RuntimeError("the executor was shut down")
        return self.runner.execute_model(scheduler_output)

    def check_health(self) -> None:
        if self.runner is None:
            raise RuntimeError("the executor was shut down")

    def shutdown(self) -> None:
        """Drop the runner (its KV cache) and the model; idempotent. The parameters' memory is freed
        and the objects kept for the next model (layers/parameters.py `release_parameters`), which
        also cuts each parameter's layer -> parameter -> loading hook -> layer cycle: it runs through
        a Paddle tensor, which Python's cycle collector cannot see into."""
        runner, self.runner = getattr(self, "runner", None), None
        if runner is None:
            return
        release_parameters(runner.model.parameters())

    def __del__(self):  # `del llm` without shutdown() releases the weights too
        try:
            self.shutdown()
        except Exception:  # at interpreter exit Paddle may already be torn down; nothing to release
            pass
