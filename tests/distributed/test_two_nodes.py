"""Tensor and pipeline parallelism over two "nodes" on this machine: the engine's node 0 runs rank 0,
a `python -m fastdeploy.worker.tp_node --node-rank 1` process runs rank 1 (the second tensor-parallel
rank, or the second pipeline stage), which connects to the engine over TCP (distributed/engine_link.py)
for its configuration and steps.

Oracle: the single-process engine's greedy tokens (up to near-ties). Faults: rank 1 SIGKILLed on
its node makes the generate fail within seconds naming it, the next generate too; shutdown() ends the
other node's command with status 0.
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import fastdeploy
from fastdeploy import LLM, SamplingParams
from fastdeploy.executor.multiproc import WorkerFailure

from test_tensor_parallel import TINY_PROMPTS, alive, assert_same_tokens, greedy_with_gaps
from tiny_llama import make_tiny_llama

SETTINGS = dict(max_model_len=512, num_gpu_blocks_override=64)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama_nodes")
    make_tiny_llama(path)
    return str(path)


def start_node_1(port: int, mode: str = "tensor") -> subprocess.Popen:
    """The other node's command for two ranks of `mode` ("tensor" or "pipeline") parallelism."""
    root = os.path.dirname(os.path.dirname(fastdeploy.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "fastdeploy.worker.tp_node", f"--{mode}-parallel-size", "2",
                             "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                             "--master-port", str(port)], env=env)


def node_1_worker(node: subprocess.Popen) -> int:
    """The pid of the worker the tp_node command started."""
    with open(f"/proc/{node.pid}/task/{node.pid}/children", encoding="utf-8") as f:
        return int(f.read().split()[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
def test_two_nodes_give_the_tokens_of_one_process_and_shut_down_cleanly(tiny_llama, mode):
    single = LLM(model=tiny_llama, **SETTINGS)
    ref = greedy_with_gaps(single, TINY_PROMPTS, 16)
    single.shutdown()
    port = free_port()
    node = start_node_1(port, mode)
    try:
        llm = LLM(model=tiny_llama, nnodes=2, master_port=port, **{f"{mode}_parallel_size": 2}, **SETTINGS)
        assert len(llm.llm_engine.executor.pids) == 1  # only rank 0 runs on the engine's node
        assert_same_tokens(greedy_with_gaps(llm, TINY_PROMPTS, 16), ref, "two nodes")
        llm.shutdown()
        assert node.wait(15) == 0
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()


@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
def test_killed_rank_on_the_other_node_is_an_error_within_seconds(tiny_llama, mode):
    port = free_port()
    node = start_node_1(port, mode)
    try:
        llm = LLM(model=tiny_llama, nnodes=2, master_port=port, **{f"{mode}_parallel_size": 2}, **SETTINGS)
        rank_0 = llm.llm_engine.executor.pids[0]
        outcome = {}

        def long_generate():
            try:
                llm.generate(TINY_PROMPTS * 4, SamplingParams(max_tokens=400, ignore_eos=True), use_tqdm=False)
            except Exception as e:  # noqa: BLE001 (the error is the result)
                outcome["error"] = e

        thread = threading.Thread(target=long_generate)
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive()
        os.kill(node_1_worker(node), signal.SIGKILL)
        thread.join(10)
        assert not thread.is_alive(), "generate still running 10 s after the other node's rank was killed"
        error = outcome.get("error")
        assert isinstance(error, WorkerFailure) and "rank 1" in str(error) and "another node" in str(error), error
        with pytest.raises(WorkerFailure):
            llm.generate(TINY_PROMPTS, SamplingParams(max_tokens=4), use_tqdm=False)
        assert not alive(rank_0)
        assert node.wait(15) != 0  # the other node's command reports its worker's death
        llm.shutdown()
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()


def test_engine_port_for_other_nodes_in_use_is_refused(tiny_llama):
    with socket.socket() as busy:
        port = free_port()
        busy.bind(("127.0.0.1", port + 1))
        busy.listen()
        with pytest.raises(ValueError, match=f"master_port \\+ 1={port + 1} on 127.0.0.1 is in use"):
            LLM(model=tiny_llama, pipeline_parallel_size=2, nnodes=2, master_port=port, **SETTINGS)
