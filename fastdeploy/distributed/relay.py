"""Rank 0 forwards the engine's messages to the ranks on other nodes.

The engine process starts, and holds a socket to, only the ranks of its own node (node 0). The
ranks of the other nodes (started there by `python -m fastdeploy.worker.tp_node`) get the
engine's messages from rank 0 through paddle.distributed: a broadcast of the pickled message's
length, then of its bytes, over the group of rank 0 and the remote ranks. They answer nothing: rank
0's answer is the step's result, and a remote rank that fails exits, which makes rank 0's next
collective fail at once (gloo reports the closed connection), so the engine hears of it from rank 0.
"""
from __future__ import annotations

import pickle

import numpy as np
import paddle
import paddle.distributed as dist

from fastdeploy.model_executor.host_arrays import as_paddle


class Relay:
    """Created by every rank of the world (a group is created collectively); `local_size` ranks
    (0 .. local_size - 1) are on the engine's node."""

    def __init__(self, world_size: int, local_size: int):
        self.group = dist.new_group([0, *range(local_size, world_size)])

    def send(self, message) -> None:
        """Rank 0: forward `message` (any picklable object) to every remote rank."""
        data = np.frombuffer(bytearray(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)), dtype=np.uint8)
        dist.broadcast(as_paddle(np.array([data.size], np.int64)), src=0, group=self.group)
        dist.broadcast(as_paddle(data), src=0, group=self.group)

    def recv(self):
        """A remote rank: the next message rank 0 forwarded."""
        size = paddle.zeros([1], dtype="int64")
        dist.broadcast(size, src=0, group=self.group)
        data = paddle.zeros([int(size.item())], dtype="uint8")
        dist.broadcast(data, src=0, group=self.group)
        return pickle.loads(data.numpy().tobytes())
