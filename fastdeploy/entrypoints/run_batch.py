"""Offline batch inference on OpenAI batch files: the `run-batch` command.

    python -m fastdeploy.entrypoints.run_batch -i requests.jsonl -o results.jsonl --model M [engine args]
    fastdeploy run-batch -i requests.jsonl -o results.jsonl --max-model-len 4096 --data-parallel-size 2

Input lines are OpenAI batch requests (`/v1/chat/completions`, `/v1/completions`); output lines are
OpenAI batch outputs, appended as requests finish. Run the same command again after a crash: it
skips what is answered and finishes the rest (entrypoints/batch/runner.py). Every `LLM(...)`
keyword is a `--kebab-case` flag (`--max-model-len 4096`, `--no-enable-prefix-caching`, dicts as JSON:
`--limit-mm-per-prompt '{"image": 4}'`, lists too: `--logits-processors '["LogitBiasLogitsProcessor"]'`). `-i -` reads
stdin, `-o -` writes stdout (without resume). Exit status: 0 when every request is answered (error
records included), 2 for unusable arguments or input (a duplicate custom_id).
See docs/run_batch.md.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from fastdeploy.engine.args_utils import add_cli_args, cli_engine_kwargs


def make_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("-i", "--input-file", required=True, help="OpenAI batch requests (JSONL), or - for stdin")
    parser.add_argument("-o", "--output-file", required=True, help="results (JSONL, appended), or - for stdout")
    parser.add_argument("--data-parallel-size", type=int, default=1,
                        help="N Ray actors, each with its own LLM (pip install fastdeploy[ray])")
    parser.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: a local instance)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cli_args(parser)
    return parser


def main(argv: Optional[list[str]] = None, prog: Optional[str] = None) -> int:
    parser = make_parser(prog)
    args = parser.parse_args(argv)
    if args.data_parallel_size < 1:
        parser.error(f"--data-parallel-size must be >= 1, got {args.data_parallel_size}")
    engine_kwargs = cli_engine_kwargs(args)
    from fastdeploy.entrypoints.batch.runner import run_job

    try:
        summary = run_job(args.input_file, args.output_file, engine_kwargs, args.data_parallel_size,
                          args.ray_address, use_tqdm=not args.no_progress)
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"run-batch: {e}", file=sys.stderr)
        return 2
    print(f"run-batch: {summary}", file=sys.stderr)
    for line, message in summary.failures:
        print(f"  line {line}: {message}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
