"""The `fastdeploy` console command: `fastdeploy run-batch ...` (entrypoints/run_batch.py) and
`fastdeploy serve MODEL ...` (the API server, entrypoints/openai/api_server.py)."""
from __future__ import annotations

import sys
from typing import Optional

COMMANDS = ("run-batch", "serve")


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: fastdeploy {{{','.join(COMMANDS)}}} ...  (got {argv[:1] or 'nothing'})", file=sys.stderr)
        return 2
    if argv[0] == "serve":
        from fastdeploy.entrypoints.openai.api_server import main as serve

        return serve(argv[1:], prog="fastdeploy serve", model_positional=True)
    from fastdeploy.entrypoints.run_batch import main as run_batch

    return run_batch(argv[1:], prog="fastdeploy run-batch")


if __name__ == "__main__":
    sys.exit(main())
