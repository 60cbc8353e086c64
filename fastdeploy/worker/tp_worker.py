"""A worker process: one rank of the model (a tensor-parallel rank of a pipeline stage), driven by
the engine process.

Started by executor/multiproc.py as `python -m fastdeploy.worker.tp_worker FD` with the rank's
paddle.distributed variables in its environment (PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM,
MASTER_ADDR, MASTER_PORT, ...: the names `paddle.distributed.launch` sets) and FD, the file
descriptor of its end of a socket pair with the engine. A rank on another node (started by
worker/tp_node.py, no FD argument) connects to the engine over TCP instead
(distributed/engine_link.py) and is then served alike. Over the connection (multiprocessing
Connection messages):

    engine -> worker   (fd_config, quant_config, threads)   once, first (quant_config: the model's, the
                                                         resolved weight format's; None: float32;
                                                         threads None: OMP_NUM_THREADS)
    worker -> engine   ("ready", resident bytes) | ("error", traceback text)
    engine -> worker   ("step", SchedulerOutput)     each step, to every rank
    worker -> engine   ("ok", ModelRunnerOutput on the sampling rank, None elsewhere) | ("error", traceback text)
    engine -> worker   ("stats",) -> ("ok", WorkerStats);  ("shutdown",) -> exits

The worker joins the process group (gloo on CPU, NCCL where Paddle has CUDA) and its stage's
tensor-parallel group, opens the checkpoint itself and loads only its stage's tensors, and of those
its shard (distributed/pipeline.py, distributed/sharding.py). Every rank runs the same steps, in
order; a stage after the first takes its input from the previous stage, one before the last sends
its output on; the last stage's tp rank 0 samples and broadcasts the token ids so its stage's other
ranks extend their request states identically.
It exits when the engine closes its end (the engine died) and ignores Ctrl-C (the engine handles it).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection

import numpy as np
import paddle  # after fastdeploy/__init__.py (the package is imported first): the MKL fix is set

from fastdeploy.distributed.parallel_state import get_pp_stage
from fastdeploy.distributed.pipeline import StageLink
from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.platforms.cpu import proc_bytes, return_freed_memory, reuse_freed_memory
from fastdeploy.worker.model_runner import ModelRunner


@dataclasses.dataclass
class WorkerStats:
    """What a rank reports about itself: resident memory, the bytes of its model's parameters as held
    (packed weights as their packed buffers), time and count of its tensor-parallel collectives so
    far, and its pipeline stage's sends to the next stage so far (bytes, seconds) and time waiting for
    the previous stage's hidden states."""

    resident_bytes: int
    parameter_bytes: int
    comm_seconds: float
    comm_calls: int
    stage: int = 0
    pipeline_bytes_sent: int = 0
    pipeline_send_seconds: float = 0.0
    pipeline_recv_seconds: float = 0.0


def resident_bytes() -> int:
    """This process's resident memory (VmRSS from /proc/self/status), 0 where unreadable."""
    return proc_bytes("/proc/self/status", "VmRSS") or 0


def parameter_bytes(model) -> int:
    """Bytes of `model`'s parameters (a paddle.nn.Layer) in the dtypes they are held in."""
    return sum(int(np.prod(p.shape)) * p.element_size() for p in model.parameters())


def wait_for_listener(host: str, port: int, timeout_s: float = 600.0) -> None:
    """Return once something accepts connections at host:port (rank 0's store). Paddle's store
    client retries every 3 s when the server is not up yet; polling here joins as soon as it is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.05)


def init_process_group():
    """Join paddle.distributed's default group from the environment."""
    import paddle.distributed as dist

    if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        os.environ.setdefault("FLAGS_selected_gpus", os.environ.get("FD_LOCAL_RANK", "0"))
        os.environ.setdefault("PADDLE_DISTRI_BACKEND", "nccl")
    else:
        os.environ.setdefault("PADDLE_DISTRI_BACKEND", "gloo")
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if int(os.environ["PADDLE_TRAINER_ID"]) == 0:
        with socket.socket() as probe:  # Paddle's store aborts the process on a port in use: say so instead
            probe.bind(("", port))  # OSError "Address already in use": the engine retries on another port
    else:
        wait_for_listener(host, port)
    dist.init_parallel_env()


def join_rank_groups(fd_config):
    """This rank's tensor-parallel group and pipeline stage (distributed/parallel_state.py), set for
    the model build; ranks are stage-major: global rank = stage x tp size + tp rank. Every rank creates
    every stage's group (paddle.distributed creates groups collectively, in the same order)."""
    import paddle.distributed as dist

    from fastdeploy.distributed.parallel_state import (PipelineStage, TensorParallelGroup, set_pp_stage,
                                                       set_tp_group, stage_layers)
    from fastdeploy.distributed.pipeline import connect_stages

    rank, tp, pp = dist.get_rank(), fd_config.tensor_parallel_size, fd_config.pipeline_parallel_size
    index, tp_rank = divmod(rank, tp)
    groups = [dist.new_group(list(range(s * tp, (s + 1) * tp))) if pp > 1 else None for s in range(pp)]
    group = TensorParallelGroup(tp_rank, tp, index * tp, groups[index])
    link = connect_stages(rank, pp * tp, tp, fd_config.master_addr) if pp > 1 else None
    stage = PipelineStage(index, pp, stage_layers(fd_config.model_config.num_hidden_layers, pp)[index], link)
    set_tp_group(group)
    set_pp_stage(stage)
    return group, stage


def build_runner(fd_config, quant_config, group, stage):
    """Open the checkpoint, build this rank's model from its local config in the weight format of
    `quant_config` (each packed weight packed from this rank's shard) and load its shard of its
    stage's tensors."""
    from fastdeploy.distributed.pipeline import stage_weights
    from fastdeploy.distributed.sharding import TensorParallelShard
    from fastdeploy.model_executor.model_loader import open_model
    from fastdeploy.model_executor.models import get_model_class

    _, source = open_model(fd_config.model_path)
    model_cls = get_model_class(fd_config.model_config.architecture, fd_config.pooling_task)
    shard = TensorParallelShard(fd_config.model_config, group.rank, group.size)  # splits checked by the engine
    local = dataclasses.replace(fd_config, model_config=shard.local_config())
    model = model_cls(local.model_config, local.cache_config.block_size, local.scheduler_config.max_model_len,
                      quant_config)
    model.load_weights(shard.shard_weights(stage_weights(source.weights(), stage, fd_config.model_config)))
    return TensorParallelModelRunner(local, model, group)


class TensorParallelModelRunner(ModelRunner):
    """A ModelRunner whose sampling happens on rank 0 only; the token ids are broadcast to the others."""

    def __init__(self, fd_config, model, group):
        super().__init__(fd_config, model, samples=group.rank == 0 and get_pp_stage().is_last)
        self.group = group

    def _receive_hidden(self, num_tokens: int) -> paddle.Tensor:
        """tp rank 0 receives the previous stage's output and broadcasts it to the stage's other ranks."""
        if self.group.rank == 0:
            hidden = super()._receive_hidden(num_tokens)
        else:
            hidden = paddle.empty([num_tokens, self.config.model_config.hidden_size], dtype="float32")
        return self.group.broadcast(hidden, src=0) if self.group.size > 1 else hidden

    def _send_hidden(self, hidden: paddle.Tensor) -> None:
        """tp rank 0 sends (every rank holds the same all-reduced output)."""
        if self.group.rank == 0:
            super()._send_hidden(hidden)

    def _sample(self, logits, samplers, drafts, grammar):
        """Rank 0 samples and verifies; every rank gets each sampler's kept tokens (a broadcast of one
        slot per row: the kept count first, the tokens after it, so every rank knows the size)."""
        if self.group.size == 1:  # a pipeline stage without tensor parallelism: nobody to tell
            return super()._sample(logits, samplers, drafts, grammar)
        rows = len(samplers) + sum(map(len, drafts))
        if self.group.rank == 0:  # the only rank that samples, so the only one that masks
            tokens, logprobs = super()._sample(logits, samplers, drafts, grammar)
            packed = np.concatenate([[len(kept)] + kept + [0] * (len(step_drafts) + 1 - len(kept))
                                     for kept, step_drafts in zip(tokens, drafts)])
            ids = as_paddle(packed.astype(np.int64))
        else:
            ids, logprobs = paddle.zeros([len(samplers) + rows], dtype="int64"), [None] * len(samplers)
        packed, tokens, at = self.group.broadcast(ids, src=0).numpy().tolist(), [], 0
        for step_drafts in drafts:
            tokens.append(packed[at + 1 : at + 1 + packed[at]])
            at += len(step_drafts) + 2
        return tokens, logprobs


def serve(conn: Connection, runner) -> None:
    """Answer the engine's messages until it says shutdown or goes away."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            message = ("shutdown",)
        kind = message[0]
        if kind == "shutdown":
            return
        try:
            if kind == "step":
                output = runner.execute_model(message[1])
                reply = ("ok", output if runner.samples else None)
            elif kind == "stats":
                group, stage = runner.group, runner.stage
                link = stage.link or StageLink(None, None)
                reply = ("ok", WorkerStats(resident_bytes(), parameter_bytes(runner.model), group.comm_seconds,
                                           group.comm_calls, stage.index, link.bytes_sent, link.send_seconds,
                                           link.recv_seconds))
            else:
                reply = ("error", f"unknown message {kind!r}")
        except Exception:
            reply = ("error", traceback.format_exc())
        try:
            conn.send(reply)
        except OSError:
            return


def main(argv: list[str]) -> int:
    """argv: [FD of the socket to the engine], or [] for a rank on another node (tp_node.py), which
    connects to the engine over TCP (distributed/engine_link.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the engine's to handle
    if argv:
        conn = Connection(int(argv[0]))
    else:
        from fastdeploy.distributed.engine_link import ENGINE_PORT_OFFSET, connect_to_engine

        conn = connect_to_engine(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + ENGINE_PORT_OFFSET,
                                 int(os.environ["PADDLE_TRAINER_ID"]))
    try:
        fd_config, quant_config, threads = conn.recv()
        if fd_config.world_size != int(os.environ["PADDLE_TRAINERS_NUM"]):  # a node's command given other sizes
            raise ValueError(f"this worker was started for {os.environ['PADDLE_TRAINERS_NUM']} ranks, but the engine "
                             f"runs {fd_config.world_size} (pipeline_parallel_size={fd_config.pipeline_parallel_size} "
                             f"x tensor_parallel_size={fd_config.tensor_parallel_size}); start tp_node with those")
        paddle.base.core.set_num_threads(threads or int(os.environ.get("OMP_NUM_THREADS", "1")))
        reuse_freed_memory()
        init_process_group()
        group, stage = join_rank_groups(fd_config)
        runner = build_runner(fd_config, quant_config, group, stage)
        return_freed_memory()
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        return 1
    conn.send(("ready", resident_bytes()))
    serve(conn, runner)
    return 0


if __name__ == "__main__":  # run from the importable module, so what it pickles names fastdeploy.worker.tp_worker
    from fastdeploy.worker import tp_worker

    sys.exit(tp_worker.main(sys.argv[1:]))
