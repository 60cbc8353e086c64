"""The TCP connections between the engine and the worker ranks on other nodes (nnodes > 1).

The engine starts, and talks to, its own node's ranks over socket pairs. A rank on another node
(started there by `python -m fastdeploy.worker.tp_node`) connects to the engine at master_addr,
master_port + 1 (`ENGINE_PORT_OFFSET`), says which rank it is, and from then on is served exactly as
a local rank: the configuration, every step and the shutdown come from the engine, its answers and
errors (with its traceback) go back, and its death closes its connection, which the engine sees at
once. TCP keepalive probes (`keep_alive`) turn a node that vanishes without closing (power, network)
into a closed connection within ~30 s on either side.

Trust: like paddle.distributed's own store, nothing is authenticated (the messages are pickles); the
ports must be reachable only from the cluster's machines.
"""
from __future__ import annotations

import socket
import time
from multiprocessing.connection import Connection

ENGINE_PORT_OFFSET = 1  # the engine listens for other nodes' ranks at master_port + 1
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 10, 5, 4


def keep_alive(sock: socket.socket) -> None:
    """Probe an idle connection every few seconds; a peer that stops answering closes it."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                          ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        if hasattr(socket, option):  # Linux; elsewhere the system's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def listen(host: str, port: int) -> socket.socket:
    """The engine's listening socket for other nodes' ranks; OSError when the port is taken."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen()
    return sock


def accept_rank(listener: socket.socket, timeout_s: float = 30.0) -> tuple[int, Connection]:
    """Accept one rank's connection: (its global rank, the Connection). OSError/EOFError when the peer
    says nothing within `timeout_s`."""
    sock, _ = listener.accept()
    keep_alive(sock)
    sock.setblocking(True)  # the Connection reads the descriptor directly
    conn = Connection(sock.detach())
    if not conn.poll(timeout_s):
        conn.close()
        raise EOFError("a connection to the engine's port sent no rank")
    kind, rank = conn.recv()
    if kind != "rank" or not isinstance(rank, int):
        conn.close()
        raise EOFError(f"a connection to the engine's port sent {kind!r}, not its rank")
    return rank, conn


def connect_to_engine(host: str, port: int, rank: int) -> Connection:
    """A rank on another node: connect to the engine (retrying until it listens: the node's command
    may start first) and introduce ourselves."""
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=5.0)
            break
        except OSError:
            time.sleep(0.2)
    keep_alive(sock)
    sock.setblocking(True)  # the Connection reads the descriptor directly
    conn = Connection(sock.detach())
    conn.send(("rank", rank))
    return conn
