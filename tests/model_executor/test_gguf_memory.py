"""A GGUF model's memory: the bytes its weights hold, read off the header (weight_format.gguf_held_bytes),
the KV pool sized from them, and loading that does not keep the file's mapped pages in RSS
(gguf_file.GGUFFile.release).

Oracles: the loaded model's own parameter bytes, gguf-py's GGUFReader for the header, and the kernel's
VmRSS / VmHWM of a fresh process for memory. The files are random-weight `llama` GGUFs written by
benchmarks/gguf_checkpoints.py (valid blocks, as llama.cpp reads them), and tiny Qwen3 (tied) / Llama
files with every matrix in one K type (tests/model_executor/gguf_checkpoints.py).
"""
import json
import math
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from benchmarks import gguf_checkpoints
from fastdeploy.model_executor.layers.quantization.weight_format import gguf_held_bytes
from fastdeploy.model_executor.model_loader.gguf_file import GGUFFile

from gguf_checkpoints import Q, write_gguf

TINY = dict(arch="llama", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=512, tied=False,
            rope_theta=10000.0, eps=1e-5, context=512)


def _write(tmp_path, quant, tied):
    """A benchmark mix (gguf_checkpoints.QUANTS) of TINY's shape, or every matrix of a tiny Qwen3 (tied) /
    Llama (untied) in one K type (tests' gguf_checkpoints.write_gguf; Q4_K_M's q/k/v parts differ in type)."""
    if quant in gguf_checkpoints.QUANTS:
        path = tmp_path / f"tiny-{quant}-{'tied' if tied else 'untied'}.gguf"
        gguf_checkpoints.write(path, {**TINY, "tied": tied}, quant, "tiny")
        return path
    return write_gguf(tmp_path, "qwen3" if tied else "llama", Q[quant])[0]


# the embedding in blocks of each layout: Q8_0 / Q4_0 interleaved, Q6_K (tied) / Q4_K (untied) row-major
CASES = [("Q8_0", False), ("Q4_0", True), ("Q6_K", True), ("Q4_K", False)]


@pytest.mark.parametrize("quant, tied", [*CASES, ("Q4_K_M", True), ("Q4_K_M", False)])
def test_held_bytes_from_the_header(tmp_path, quant, tied):
    """Matrices at the file's tensor sizes, Q4_0 / Q8_0 with their float16 scales widened to float32
    (18 -> 20 bytes a block, 34 -> 36), the K-quants as stored; the embedding once in its blocks (tied:
    they are lm_head's too), the norms in float32; the sizes and element counts from gguf-py's reader."""
    path = _write(tmp_path, quant, tied=tied)
    widened = {gguf.GGMLQuantizationType.Q8_0: 36 / 34, gguf.GGMLQuantizationType.Q4_0: 20 / 18}
    expected = 0
    for t in gguf.GGUFReader(str(path)).tensors:
        in_blocks = t.tensor_type != gguf.GGMLQuantizationType.F32 and len(t.shape) == 2
        expected += t.n_bytes * widened.get(t.tensor_type, 1) if in_blocks else 4 * t.n_elements
    assert gguf_held_bytes(GGUFFile(path)) == pytest.approx(expected, abs=1)


@pytest.mark.parametrize("quant, tied", CASES)
def test_kv_pool_sized_from_the_held_bytes(tmp_path, monkeypatch, quant, tied):
    """The engine sizes the pool from gguf_held_bytes (not from the float32 estimate), and the held bytes
    are what the loaded model's parameters really take."""
    from fastdeploy import LLM
    from fastdeploy.cache_manager import kv_cache_sizing

    path = _write(tmp_path, quant, tied=tied)
    seen = []
    real = kv_cache_sizing.size_kv_cache
    monkeypatch.setattr(kv_cache_sizing, "size_kv_cache", lambda config, weights, dtype: (
        seen.append((weights, config.model_config.weight_bytes())), real(config, weights, dtype))[1])
    llm = LLM(model=str(path), max_model_len=256, max_num_seqs=2)
    model = llm.llm_engine.executor.runner.model
    held = sum(p.numel().item() * p.element_size() for p in model.parameters())
    (weights, as_float32), = seen
    assert weights == gguf_held_bytes(GGUFFile(path)) == held
    assert weights < 0.6 * as_float32  # the old estimate: every weight in float32


RSS_CHILD = """
import json, sys, threading, time
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
from fastdeploy import LLM
import paddle, numpy
before = {"rss": status("VmRSS"), "file": status("RssFile")}
most_file, done = [before["file"]], threading.Event()
def sample():  # the file-backed part of RSS (the mapped GGUF pages, the libraries), every 20 ms
    while not done.wait(0.02):
        most_file[0] = max(most_file[0], status("RssFile"))
threading.Thread(target=sample, daemon=True).start()
llm = LLM(model=sys.argv[1], max_model_len=256, max_num_seqs=1, num_gpu_blocks_override=8)
done.set()
print(json.dumps({"before": before, "most_file": most_file[0], "peak": status("VmHWM"), "after": status("VmRSS")}))
"""


def test_loading_does_not_keep_the_mapped_file_in_rss(tmp_path):
    """A ~360 MB Q8_0 file (llama-small) loaded in a fresh process. While loading, the file-backed RSS
    (the GGUF's mapped pages) never grows by more than a quarter of the file (without release() it
    grows to the whole file by the end of the load); after loading, RSS has grown by the weights held
    (gguf_held_bytes) and at most a third of the file more (the KV pool, the allocator's slack)."""
    path = tmp_path / "llama-small-Q8_0.gguf"
    gguf_checkpoints.write(path, gguf_checkpoints.SHAPES["llama-small"], "Q8_0", "llama-small")
    size, held = os.path.getsize(path), gguf_held_bytes(GGUFFile(path))
    proc = subprocess.run([sys.executable, "-c", RSS_CHILD, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rss = json.loads(proc.stdout.strip().splitlines()[-1])
    mapped, grown = rss["most_file"] - rss["before"]["file"], rss["after"] - rss["before"]["rss"]
    message = (f"file {size >> 20} MiB, held {held >> 20} MiB; while loading the file-backed RSS grew by "
               f"{mapped >> 20} MiB at most; after loading RSS grew {grown >> 20} MiB "
               f"(peak {(rss['peak'] - rss['before']['rss']) >> 20} MiB)")
    assert mapped <= size / 4, message
    assert grown <= held + size / 3, message
