"""The worker ranks of one node other than the engine's: `python -m fastdeploy.worker.tp_node`.

    python -m fastdeploy.worker.tp_node --tensor-parallel-size 2 --pipeline-parallel-size 2 --nnodes 2 \\
        --node-rank 1 --master-addr 10.0.0.1 --master-port 29500

starts this node's pipeline_parallel_size x tensor_parallel_size / nnodes worker processes (global
ranks node_rank x that count onwards, stage-major: here stage 1's two ranks) with paddle.distributed's
variables, names as `paddle.distributed.launch` uses them. The engine runs on node 0 (`LLM(...,
tensor_parallel_size=2, pipeline_parallel_size=2, nnodes=2, master_addr=..., master_port=29500)`);
these workers connect to it at master_port + 1 (distributed/engine_link.py), receive the
configuration and every step from it, join its process group and open the checkpoint at the same
`model` path on this node. The command returns when the engine shuts down (its workers then exit) with the first
non-zero exit status of its workers; when one of them fails the others are killed.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def worker_env(rank: int, world: int, nnodes: int, master_addr: str, master_port: int, threads: int) -> dict:
    """The environment of global rank `rank`'s worker process."""
    return dict(os.environ, PADDLE_TRAINER_ID=str(rank), PADDLE_TRAINERS_NUM=str(world),
                MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), PADDLE_CURRENT_ENDPOINT=f"{master_addr}:{master_port}",
                PADDLE_TRAINER_ENDPOINTS=f"{master_addr}:{master_port}", FD_LOCAL_RANK=str(rank % (world // nnodes)),
                OMP_NUM_THREADS=str(threads))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastdeploy.worker.tp_node", description=__doc__.split("\n")[0])
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    args = parser.parse_args(argv)
    world, nnodes = args.tensor_parallel_size * args.pipeline_parallel_size, args.nnodes
    if nnodes < 2 or world % nnodes or not 0 < args.node_rank < nnodes:
        parser.error(f"need nnodes >= 2 dividing the ranks (pipeline x tensor parallel size = {world}) and "
                     "0 < node_rank < nnodes "
                     f"(node 0 is the engine's), got nnodes={nnodes}, node_rank={args.node_rank}")
    local = world // nnodes
    threads = max(1, len(os.sched_getaffinity(0)) // local)
    procs = [subprocess.Popen([sys.executable, "-m", "fastdeploy.worker.tp_worker"],
                              env=worker_env(args.node_rank * local + i, world, nnodes, args.master_addr,
                                             args.master_port, threads))
             for i in range(local)]
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return next((p.returncode for p in procs if p.returncode), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
