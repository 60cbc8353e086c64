"""The OpenAI-compatible API server.

    python -m fastdeploy.entrypoints.openai.api_server --model M --port 8000 [--host H] [engine args]
    fastdeploy serve M --port 8000 --max-model-len 4096 --served-model-name my-model --api-key K

One LLM (every `LLM(...)` keyword is a --kebab-case flag, as for run-batch) whose engine runs
continuously on the engine loop (engine/async_engine.py) under FastAPI + uvicorn (app.py). Server
flags: --host, --port (8000), --metrics-port (another port for /metrics), --served-model-name (one or
more; default: --model, or "default"), --api-key (repeatable; else the FD_API_KEY environment
variable), --max-concurrency (429 beyond it), --timeout-graceful-shutdown, --disable-uvicorn-access-log.

Shutdown: on SIGTERM or SIGINT the server stops accepting (/v1 and /health answer 503), lets the
requests in flight finish for up to --timeout-graceful-shutdown seconds, aborts the rest (their
streams end with finish_reason "abort"), shuts the engine down (tensor-parallel workers included)
and exits 0. A second signal skips the wait. Settings the engine refuses (or a model that is not on
this machine) exit 2 with their message. See docs/serving.md.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import Optional

import uvicorn

from fastdeploy.engine.args_utils import add_cli_args, cli_engine_kwargs

logger = logging.getLogger("fastdeploy")
DEFAULT_PORT = 8000
ABORT_WAIT = 10.0  # seconds for aborted streams to send their last events


def make_parser(prog: Optional[str] = None, model_positional: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    if model_positional:  # `fastdeploy serve M`
        parser.add_argument("model_tag", nargs="?", default=None, help="the model (same as --model)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--served-model-name", nargs="+", default=None,
                        help="the model name(s) requests may give (default: --model, or 'default')")
    parser.add_argument("--api-key", action="append", default=None,
                        help="accepted API key (repeatable; default: the FD_API_KEY environment variable)")
    parser.add_argument("--max-concurrency", type=int, default=2048,
                        help="requests answered at once; more get HTTP 429 (default 2048)")
    parser.add_argument("--timeout-graceful-shutdown", type=float, default=30.0,
                        help="seconds in-flight requests may take to finish after SIGTERM/SIGINT before they "
                             "are aborted (default 30; 0 aborts at once)")
    parser.add_argument("--disable-uvicorn-access-log", action="store_true", help="no log line per request")
    add_cli_args(parser)
    return parser


def parse_args(argv: Optional[list[str]], prog: Optional[str] = None, model_positional: bool = False):
    parser = make_parser(prog, model_positional)
    args = parser.parse_args(argv)
    if model_positional and args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            parser.error(f"the model is given twice: {args.model_tag!r} and --model {args.model!r}")
        args.model = args.model_tag
    if args.max_concurrency < 1:
        parser.error(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if args.timeout_graceful_shutdown < 0:
        parser.error(f"--timeout-graceful-shutdown must be >= 0, got {args.timeout_graceful_shutdown}")
    return args


def build_state(args):
    """The LLM (loaded here), its engine loop (started) and the app's ServerState."""
    from fastdeploy import LLM
    from fastdeploy.engine.async_engine import AsyncEngine
    from fastdeploy.entrypoints.openai.app import ServerState
    from fastdeploy.entrypoints.openai.metrics import ServerMetrics
    from fastdeploy.entrypoints.openai.serving import OpenAIServing

    llm = LLM(**cli_engine_kwargs(args))
    engine = AsyncEngine(llm.llm_engine)
    engine.start()
    serving = OpenAIServing(llm, engine, ServerMetrics(lambda: engine.stats))
    keys = args.api_key or ([os.environ["FD_API_KEY"]] if os.environ.get("FD_API_KEY") else [])
    names = args.served_model_name or [args.model if args.model is not None else "default"]
    config = llm.llm_engine.config
    return ServerState(serving=serving, served_model_names=names, model_path=str(config.model_path),
                       max_model_len=config.scheduler_config.max_model_len, api_keys=keys,
                       max_concurrency=args.max_concurrency,
                       metrics_on_api_port=args.metrics_port in (None, args.port))


def main(argv: Optional[list[str]] = None, prog: Optional[str] = None, model_positional: bool = False) -> int:
    args = parse_args(argv, prog, model_positional)
    from fastdeploy.entrypoints.openai.app import build_app

    try:
        state = build_state(args)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:  # the settings' own messages
        print(f"{prog or 'api_server'}: {e}", file=sys.stderr)
        return 2
    port = args.port or DEFAULT_PORT
    if not state.metrics_on_api_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.host, registry=state.serving.metrics.registry)
    config = uvicorn.Config(build_app(state), host=args.host, port=port, log_level="info",
                            access_log=not args.disable_uvicorn_access_log, timeout_graceful_shutdown=ABORT_WAIT)
    server = DrainingServer(config, state, args.timeout_graceful_shutdown)
    try:
        server.run()
    finally:
        state.serving.engine.shutdown()
    return 0 if server.started else 1


class DrainingServer(uvicorn.Server):
    """uvicorn's Server whose first SIGTERM/SIGINT drains: 503 for new requests, the ones in flight
    get `grace` seconds, then the rest are aborted and uvicorn stops. A second signal stops at once."""

    def __init__(self, config, state, grace: float):
        super().__init__(config)
        self.state, self.grace = state, grace

    def handle_exit(self, sig, frame) -> None:
        if self.state.draining:  # a second signal: stop now
            self.force_exit = self.should_exit = True
            return
        logger.info("signal %d: draining (%d requests in flight, up to %.0f s), then shutting down",
                    sig, self.state.in_flight, self.grace)
        self.state.draining = True
        threading.Thread(target=self._drain, name="fastdeploy-drain", daemon=True).start()

    def _drain(self) -> None:
        self._wait_idle(self.grace)
        if self.state.in_flight:
            logger.info("aborting %d requests still in flight", self.state.in_flight)
            self.state.serving.engine.abort_all()
            self._wait_idle(ABORT_WAIT)
        self.should_exit = True

    def _wait_idle(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.state.in_flight and time.monotonic() < end and not self.force_exit:
            time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
