"""Sparse-MoE decode: the compiled MoE MLP inside `fd_decoder_layers` against the layer-by-layer path with
SparseMoE's numpy routing and one Paddle call chain per active expert, in one run.

The model: a random ERNIE-4.5-MoE checkpoint with ERNIE-4.5-21B-A3B's routing (64 experts, top-6, 2
shared experts, dense first layer) at smaller widths (hidden 1024, expert intermediate 512, 6 layers,
bf16 weights), written by transformers under --scratch once. Per batch size B: B prompts of 32
tokens, 64 new tokens each, greedy, EOS ignored; tok/s over the call and tokens per CPU-second (both
threads), the fused op first, then the layer-by-layer path, then the fused op again (a warm-up call
before each).

    python benchmarks/benchmark_moe_fusion.py [--batch 1 16] [--scratch /tmp/fd_bench_scratch]
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without install

import fastdeploy  # noqa: E402,F401  (first: CPU environment before paddle)
from fastdeploy import LLM, SamplingParams  # noqa: E402
from fastdeploy.model_executor.layers.moe import SparseMoE  # noqa: E402
from fastdeploy.model_executor.ops import compiled_op  # noqa: E402

NEW_TOKENS = 64


def write_checkpoint(path: Path) -> None:
    import torch
    from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM

    sys.path.insert(0, str(REPO / "tests" / "model_executor"))
    from test_moe_vs_transformers import write_tokenizer  # the tiny models' tokenizer

    torch.manual_seed(0)
    config = Ernie4_5_MoeConfig(vocab_size=32000, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=512,
                                num_hidden_layers=6, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                                moe_num_experts=64, moe_k=6, moe_layer_start_index=1, moe_num_shared_experts=2,
                                use_bias=False, tie_word_embeddings=True, rms_norm_eps=1e-5)
    Ernie4_5_MoeForCausalLM(config).eval().to(torch.bfloat16).save_pretrained(str(path))
    write_tokenizer(path)


def set_path(llm: LLM, fused: bool, plan: list) -> None:
    """The fused plan, or every layer through DecoderLayer.forward with SparseMoE's numpy path."""
    decoder = llm.llm_engine.executor.runner.model.model
    decoder.runs = plan if fused else list(decoder.layers)
    for layer in decoder.layers:
        if isinstance(layer.mlp, SparseMoE):
            layer.mlp._op = compiled_op("fd_moe_mlp") if fused else None


def timed(llm: LLM, prompts: list[list[int]]) -> tuple[float, float]:
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True, temperature=0)
    requests = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(requests, params, use_tqdm=False)  # warm-up
    start, start_cpu = time.perf_counter(), time.process_time()
    llm.generate(requests, params, use_tqdm=False)
    tokens = len(prompts) * NEW_TOKENS
    return tokens / (time.perf_counter() - start), tokens / (time.process_time() - start_cpu)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--scratch", default=str(Path(tempfile.gettempdir()) / "fd_bench_scratch"))
    args = ap.parse_args()
    path = Path(args.scratch) / "ernie-moe-64x6-random"
    if not (path / "config.json").is_file():
        print(f"writing the MoE checkpoint to {path} (once)", flush=True)
        write_checkpoint(path)
    llm = LLM(model=str(path), max_num_seqs=max(args.batch), max_model_len=1024)
    plan = llm.llm_engine.executor.runner.model.model.runs
    for batch in args.batch:
        prompts = [[5 + i, 17, 99, 1000 + i] * 8 for i in range(batch)]
        rows = []
        for label, fused in (("fused", True), ("layer by layer", False), ("fused", True)):
            set_path(llm, fused, plan)
            rows.append((label, *timed(llm, prompts)))
        set_path(llm, True, plan)
        print(f"\n=== batch {batch}: {NEW_TOKENS} new tokens each ===")
        for label, wall, cpu in rows:
            print(f"{label:<16}{wall:>9.1f} tok/s{cpu:>9.1f} tok per CPU-s")
        best = max(r[1] for r in rows if r[0] == "fused")
        print(f"ratio fused / layer by layer: {best / rows[1][1]:.2f}x wall, "
              f"{max(r[2] for r in rows if r[0] == 'fused') / rows[1][2]:.2f}x per CPU-s")


if __name__ == "__main__":
    main()
