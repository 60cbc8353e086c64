"""How a checkpoint is cut into pipeline stages (GPipe's layer partition, Huang et al. 2019; vLLM's split).

Stage s of P holds a contiguous range of decoder layers (`parallel_state.stage_layers`: L // P each,
the L % P left over one each to the stages before the last, from the second-to-last backwards), the
first stage also the embedding, the last the final norm and lm_head (with tied embeddings the last
stage reads the embedding's tensor into its lm_head, as one process does). Within a stage the
layers are split over its tensor-parallel ranks as without stages (distributed/sharding.py).

The hidden states of a step cross a stage boundary as one float32 [tokens, hidden] array (the
layers' output with the residual added) over a TCP connection from tp rank 0 of stage s to tp rank 0
of stage s + 1 (`StageLink`; with tensor parallelism every tp rank holds the whole array after its
all-reduce, and the receiving tp rank 0 broadcasts it to its stage's others, so one copy crosses the
boundary, which may be a link between machines), not paddle.distributed's point-to-point calls: gloo's send waits until
the receiver is at its receive, and its pair groups failed to connect here, while a socket buffers a
step's bytes (the stage goes on with its next step) and reports a peer's death as a closed
connection. Each rank listens on the address it reaches the master by; the addresses go through
paddle.distributed's key-value store (`connect_stages`), not a collective over the world group: a
world collective after the stages' groups were created timed out now and then.
"""
from __future__ import annotations

import re
import socket
import time
from typing import Iterable, Iterator, Optional

import numpy as np
import paddle

from fastdeploy.config import VL_ARCHITECTURES, ModelConfig
from fastdeploy.distributed.parallel_state import PipelineStage, stage_layers
from fastdeploy.model_executor.host_arrays import as_paddle

ADDRESS_KEY = "fastdeploy/stage_link"  # + "/rank": "host:port" of that rank's listener, in the store

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def check_pipeline_parallel(config: ModelConfig, size: int) -> None:
    """ValueError naming the numbers when the model cannot be cut into `size` stages (before loading):
    more stages than decoder layers, or a model stages do not serve yet (ERNIE-4.5-VL's vision tower
    and M-RoPE, BERT-style encoders)."""
    stage_layers(config.num_hidden_layers, size)
    if config.encoder_only or config.architecture in VL_ARCHITECTURES:
        raise ValueError(f"pipeline_parallel_size={size}: {config.architecture} is not supported by pipeline "
                         "parallelism yet (decoder-only text models are); use tensor_parallel_size")


def describe_stages(num_layers: int, size: int) -> str:
    """The layer ranges of `size` stages for the log, e.g. "0, 1-2, 3 (uneven: the layers do not divide)"."""
    layers = stage_layers(num_layers, size)
    ranges = ", ".join(f"{r.start}-{r.stop - 1}" if len(r) > 1 else f"{r.start}" for r in layers)
    return ranges + ("" if num_layers % size == 0 else " (uneven: the layers do not divide)")


def stage_weights(weights: Iterable[tuple[str, object]], stage: PipelineStage,
                  config: ModelConfig) -> Iterator[tuple[str, object]]:
    """The (checkpoint name, tensor) pairs stage `stage` loads, from the checkpoint's stream: its
    layers', the embedding on the first stage (and on the last when tied: lm_head reads it), the final
    norm and lm_head on the last."""
    for name, tensor in weights:
        layer = _LAYER.match(name)
        if layer is not None:
            keep = int(layer.group(1)) in stage.layers
        elif name == "model.embed_tokens.weight":
            keep = stage.is_first or (stage.is_last and config.tie_word_embeddings)
        elif name.startswith(("model.norm.", "lm_head.")):
            keep = stage.is_last
        else:
            keep = True
        if keep:
            yield name, tensor


class StageLink:
    """A rank's connections to its neighbours in the pipeline: `prev` (from the previous stage's rank)
    and `next` (to the next stage's), connected sockets or None at the ends. `bytes_sent` /
    `send_seconds` / `recv_seconds`: totals so far, for benchmarks/."""

    def __init__(self, prev: Optional[socket.socket], next: Optional[socket.socket]):
        self.prev, self.next = prev, next
        self.bytes_sent, self.send_seconds, self.recv_seconds = 0, 0.0, 0.0

    def send(self, hidden: paddle.Tensor) -> None:
        """Hand `hidden` [n, hidden_size] float32 to the next stage (returns once the kernel has the bytes)."""
        start = time.perf_counter()
        data = np.ascontiguousarray(np.from_dlpack(hidden))
        self.next.sendall(memoryview(data).cast("B"))
        self.send_seconds += time.perf_counter() - start
        self.bytes_sent += data.nbytes

    def recv(self, num_tokens: int, hidden_size: int) -> paddle.Tensor:
        """The previous stage's hidden states of this step, [num_tokens, hidden_size] float32.
        ConnectionError when the previous stage's rank went away."""
        start = time.perf_counter()
        hidden = np.empty([num_tokens, hidden_size], dtype=np.float32)
        view, got = memoryview(hidden).cast("B"), 0
        while got < hidden.nbytes:
            n = self.prev.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("the previous pipeline stage's rank closed its connection")
            got += n
        self.recv_seconds += time.perf_counter() - start
        return as_paddle(hidden)


def connect_stages(rank: int, world_size: int, tp_size: int, master_addr: str) -> StageLink:
    """Each stage's tp rank 0 (global rank r, a multiple of tp_size) listens for the previous stage's
    (r - tp_size), connects to the next stage's (r + tp_size) and accepts; the other tp ranks get no
    connection (their stage's tp rank 0 shares what it receives). The listeners' addresses go through
    paddle.distributed's key-value store (rank 0's, which every rank joined at init); a get waits
    until the key is set."""
    from paddle.base import core

    store = core.create_or_get_global_tcp_store()
    leads = rank % tp_size == 0
    has_prev, has_next = leads and rank >= tp_size, leads and rank + tp_size < world_size
    listener = socket.create_server((reachable_address(master_addr), 0)) if has_prev else None
    if listener is not None:
        host, port = listener.getsockname()[:2]
        store.set(f"{ADDRESS_KEY}/{rank}", f"{host}:{port}")
    next_sock = prev_sock = None
    if has_next:
        host, port = bytes(store.get(f"{ADDRESS_KEY}/{rank + tp_size}")).decode().rsplit(":", 1)
        next_sock = socket.create_connection((host, int(port)))
    if listener is not None:
        prev_sock, _ = listener.accept()
        listener.close()
    for sock in (prev_sock, next_sock):
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return StageLink(prev_sock, next_sock)


def reachable_address(master_addr: str) -> str:
    """The address of this machine's interface that routes to `master_addr` (the same machine: itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master_addr, 9))  # a UDP connect sends nothing, it only picks the route
        return probe.getsockname()[0]
