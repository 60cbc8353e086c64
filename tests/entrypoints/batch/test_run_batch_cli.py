"""The run-batch command line: every LLM(...) keyword as a --kebab-case flag, stdin/stdout, and
usage errors that name the problem."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fastdeploy.engine.args_utils import EngineArgs
from fastdeploy.entrypoints import cli
from fastdeploy.entrypoints.run_batch import make_parser

REPO = Path(__file__).resolve().parents[3]


def engine_kwargs(argv):
    args = make_parser().parse_args(["-i", "in", "-o", "out", *argv])
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineArgs) if getattr(args, f.name) is not None}


def test_every_engine_keyword_is_a_kebab_case_flag():
    flags = {a.dest: a.option_strings for a in make_parser()._actions}
    for f in dataclasses.fields(EngineArgs):
        assert "--" + f.name.replace("_", "-") in flags[f.name], f.name


def test_flags_become_llm_keywords_and_unset_ones_keep_the_defaults():
    got = engine_kwargs(["--model", "m.gguf", "--max-model-len", "4096", "--gpu-memory-utilization", "0.5",
                         "--no-enable-prefix-caching", "--enable-chunked-prefill", "--reasoning-parser", "qwen3"])
    assert got == {"model": "m.gguf", "max_model_len": 4096, "gpu_memory_utilization": 0.5,
                   "enable_prefix_caching": False, "enable_chunked_prefill": True, "reasoning_parser": "qwen3"}
    assert engine_kwargs([]) == {}


@pytest.mark.parametrize("argv", [["--max-model-len", "many"], ["--unknown-flag", "1"], []])
def test_bad_arguments_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        make_parser().parse_args(argv if not argv else ["-i", "x", "-o", "y", *argv])
    assert e.value.code == 2


def test_the_fastdeploy_command_names_its_subcommands(capsys):
    assert cli.main(["bogus"]) == 2
    err = capsys.readouterr().err
    assert "run-batch" in err and "serve" in err


def test_stdin_to_stdout():
    lines = [{"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "Hello", "max_tokens": 3, "temperature": 0}},
             {"custom_id": "b", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}}]
    done = subprocess.run([sys.executable, "-m", "fastdeploy.entrypoints.run_batch", "-i", "-", "-o", "-",
                           "--no-progress", "--max-model-len", "256"], input="".join(json.dumps(x) + "\n" for x in lines),
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(r["custom_id"] for r in records) == ["a", "b"]
    assert "2 done, 0 failed, 0 skipped" in done.stderr
