"""Every parameter FastDeploy's and vLLM's offline-inference docs list is accepted and means what they say.

The parameter lists below are the docs' own, name for name and with the values the docs give (their
defaults, or the values of their examples): FastDeploy's offline inference page in three versions
(2025-06 markdown, the docs site, the latest site) and its Chinese Qwen page, and vLLM's offline
inference page. Where the docs' files are on this machine (FD_SEED_DOCS, or `seeds/` in the team's
shared folder beside the checkout), `test_lists_are_the_docs_lists` parses them and checks that these
lists are exactly theirs, so the lists cannot drift from the docs.

Each test builds LLM on a tiny random Llama with the parameters verbatim and checks their meaning where
the engine shows it (the resolved configuration, outputs, logs, a port left free).
"""
import logging
import os
import re
import socket
import warnings
from pathlib import Path

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.args_utils import EngineArgs

from helpers import contains
from tiny_checkpoints import make_checkpoint

# fastdeploy_offline_inference_zh_qwen.md, "2.1 fastdeploy.LLM": every setting with the default it states
# (use_warmup states none: 1 turns it on)
FD_LLM_LIST = dict(
    max_model_len=2048, tensor_parallel_size=1, block_size=64, max_num_seqs=8, gpu_memory_utilization=0.9,
    num_gpu_blocks_override=None, max_num_batched_tokens=None, kv_cache_ratio=0.75, use_warmup=1,
    engine_worker_queue_port=8002, enable_mm=False,
)
# the LLM(...) calls of the FastDeploy pages' examples (the latest site adds enable_mm=True)
FD_LLM_EXAMPLES = [
    dict(tensor_parallel_size=1, max_model_len=8192),
    dict(tensor_parallel_size=1, max_model_len=4096),
    dict(tensor_parallel_size=1, max_model_len=32768, limit_mm_per_prompt={"image": 100}, reasoning_parser="ernie-45-vl"),
    dict(tensor_parallel_size=1, max_model_len=32768, enable_mm=True, limit_mm_per_prompt={"image": 100},
         reasoning_parser="ernie-45-vl"),
]
# "Configuration Notes" of the 2025-06, docs-site and latest pages: "port and metrics_port is only used
# for online inference"
FD_ONLINE_ONLY = ("port", "metrics_port")
# "2.2 / 2.3 fastdeploy.LLM.generate / .chat" of every FastDeploy page
FD_GENERATE_ARGS = ("prompts", "sampling_params", "use_tqdm")
FD_CHAT_ARGS = ("messages", "sampling_params", "use_tqdm", "chat_template_kwargs")
# "2.4 fastdeploy.SamplingParams" (docs site: the longest list), with sensible values
FD_SAMPLING_LIST = dict(
    presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2, temperature=0.8, top_p=0.95, top_k=20,
    min_p=0.05, max_tokens=12, min_tokens=4, bad_words=["fox"],
)
# the Chinese page's "2.3 fastdeploy.SamplingParams" spells frequency_penalty "frequence_penalty": a typo
# (FastDeploy's SamplingParams has no such field either)
FD_SAMPLING_TYPOS = {"frequence_penalty": "frequency_penalty"}

# vllm_offline_inference.txt, "LLM Class Initialization" example and "Common Initialization Parameters"
VLLM_LLM_LIST = dict(dtype="auto", gpu_memory_utilization=0.9, max_model_len=2048, tensor_parallel_size=1,
                     trust_remote_code=False, pipeline_parallel_size=1)
VLLM_DTYPES = ("auto", "float16", "bfloat16", "float32")  # "dtype: ... (auto, float16, bfloat16, float32)"
# values of the page's examples this engine cannot serve: a clear ValueError each
# (its pipeline_parallel_size=4 is served: tests/distributed/test_pipeline_parallel.py)
VLLM_REFUSED = [(dict(task="transcription"), r"task must be one of \['auto', 'generate', 'embed', 'classify', 'score', 'reward'\], got 'transcription'")]
# its "SamplingParams Configuration" example, verbatim
VLLM_SAMPLING_LIST = dict(n=1, temperature=0.8, top_p=0.95, top_k=50, max_tokens=100, stop=[".", "!", "?"],
                          presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, logprobs=None)
VLLM_SAMPLING_EXAMPLES = [dict(n=3, temperature=0.9, max_tokens=50), dict(temperature=0.8, logprobs=5, prompt_logprobs=5)]

SMALL = dict(max_model_len=256, num_gpu_blocks_override=64)  # where a test only needs some engine


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny_llama")
    make_checkpoint(path)
    return str(path)


def build(tiny, **kwargs) -> LLM:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # enable_mm (tested on its own below)
        return LLM(model=tiny, **kwargs)


def run(llm, prompt, params):
    return llm.generate(prompt, params, use_tqdm=False)[0]


# ---- the lists are the docs' ----------------------------------------------------------------------
def seed_dir():
    candidates = [os.environ.get("FD_SEED_DOCS")] + [str(p / "shared" / "seeds") for p in Path(__file__).resolve().parents]
    return next((Path(c) for c in candidates if c and Path(c).is_dir()), None)


def call_kwargs(text: str, callee: str) -> set:
    """Keyword names of every `callee(...)` call in text (parentheses balanced; `#` comments dropped)."""
    names = set()
    for match in re.finditer(rf"\b{callee}\(", text):
        depth, i = 1, match.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        args = re.sub(r"#[^\n]*?(?=\s\w+=|\n|$)", " ", text[match.end():i - 1])
        names |= set(re.findall(r"(?<![\w.\"'])(\w+)\s*=(?!=)", args))
    return names


def listed(text: str, heading: str, until_prose: bool = False) -> set:
    """Names of the `name(type): ...` / `name: ...` items under a heading, up to the next numbered
    heading (FastDeploy's pages), or with until_prose the first line after them that is not an item
    (vLLM's bullet lists)."""
    names, inside = set(), False
    for line in text.splitlines():
        if re.match(rf"^\s*(?:#+\s*)?(?:\d\.\d+\s+)?{re.escape(heading)}\s*$", line):
            inside = True
            continue
        if inside and re.match(r"^\s*(?:#+\s*)?\d\.\d+\s", line):
            break
        item = re.match(r"^\s*(?:[*•]\s*)?(\w+)\s*(?:\(|:)", line) if inside else None
        if item and item.group(1) not in ("usage", "example"):
            names.add(item.group(1))
        elif until_prose and inside and names and line.strip() and not line.lstrip().startswith((">", "*", "•")):
            break
    return names


def test_lists_are_the_docs_lists():
    seeds = seed_dir()
    if seeds is None:
        pytest.skip("the docs' files are not on this machine (set FD_SEED_DOCS); the lists above stay in force")
    fd = {name: (seeds / name).read_text(encoding="utf-8") for name in (
        "fastdeploy_offline_inference_2025-06.md", "fastdeploy_offline_inference_docsite.txt",
        "fastdeploy_offline_inference_latest.txt", "fastdeploy_offline_inference_zh_qwen.md")}
    vllm = (seeds / "vllm_offline_inference.txt").read_text(encoding="utf-8")
    zh = fd["fastdeploy_offline_inference_zh_qwen.md"]

    assert listed(zh, "fastdeploy.LLM") == set(FD_LLM_LIST) | {"model"}
    assert set().union(*(call_kwargs(t, "LLM") for t in fd.values())) == \
        set().union(*FD_LLM_EXAMPLES) | {"model"}
    for text in fd.values():
        if "only used for online inference" in text:
            assert re.search(r"`?port`? and `?metrics_port`? is only used for online inference", text)
        assert listed(text, "fastdeploy.LLM.generate") == set(FD_GENERATE_ARGS)
        chat = listed(text, "fastdeploy.LLM.chat")
        assert not chat or chat == set(FD_CHAT_ARGS)
    fd_sampling = set().union(*(listed(t, "fastdeploy.SamplingParams") | call_kwargs(t, "SamplingParams")
                                for t in fd.values()))
    assert fd_sampling == set(FD_SAMPLING_LIST) | set(FD_SAMPLING_TYPOS)

    assert listed(vllm, "Common Initialization Parameters", until_prose=True) - {"model"} <= set(VLLM_LLM_LIST)
    assert call_kwargs(vllm, "LLM") == set(VLLM_LLM_LIST) | {"model", "task"}
    assert set(VLLM_DTYPES) == set(re.search(r"dtype: .*\(([^)]*)\)", vllm).group(1).replace(" ", "").split(","))
    assert call_kwargs(vllm, "SamplingParams") == set(VLLM_SAMPLING_LIST) | set().union(*VLLM_SAMPLING_EXAMPLES)


# ---- FastDeploy ------------------------------------------------------------------------------------
def test_fastdeploy_llm_list_verbatim(tiny, caplog):
    """zh page's list at its defaults: builds, and each setting shows in the engine it built."""
    caplog.set_level(logging.INFO, logger="fastdeploy")
    llm = build(tiny, **FD_LLM_LIST)
    config = llm.llm_engine.config
    sc, cc = config.scheduler_config, config.cache_config
    assert (sc.max_model_len, sc.max_num_seqs, cc.block_size, config.tensor_parallel_size) == (2048, 8, 64, 1)
    assert sc.max_num_batched_tokens == 8192  # None: its default without chunked prefill, max(8192, max_model_len)
    assert cc.num_blocks == 8 * (2048 // 64) + 1  # None override: sized from memory, capped at 8 full sequences
    assert (cc.gpu_memory_utilization, cc.kv_cache_ratio) == (0.9, 0.75)
    warmups = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm-up:")]
    assert len(warmups) == 1 and warmups[0].startswith("warm-up: 8 prompts x 1024 tokens")  # 8 x 1024 = the step budget


def test_enable_mm_is_accepted_deprecated():
    with pytest.warns(DeprecationWarning, match="enable_mm is deprecated and ignored"):
        EngineArgs.from_kwargs(None, dict(enable_mm=True))


def test_online_only_ports_are_accepted_and_never_opened(tiny):
    """port, metrics_port and engine_worker_queue_port held by another socket: LLM does not need them."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        llm = build(tiny, port=busy, metrics_port=busy, engine_worker_queue_port=busy, **SMALL)
        assert run(llm, "The quick", SamplingParams(temperature=0, max_tokens=3)).outputs.token_ids
    build(tiny, engine_worker_queue_port="8002,8003", **SMALL)  # FastDeploy's form for several ranks


@pytest.mark.parametrize("example", FD_LLM_EXAMPLES, ids=lambda e: f"max_model_len={e['max_model_len']}")
def test_fastdeploy_examples_verbatim(tiny, example):
    """The pages' LLM(...) calls, then generate/chat with their SamplingParams(top_p=0.95, max_tokens=6400)
    and every generate/chat argument the pages list."""
    llm = build(tiny, **example)
    config = llm.llm_engine.config
    assert config.scheduler_config.max_model_len == example["max_model_len"]
    assert config.reasoning_parser == example.get("reasoning_parser")
    params = SamplingParams(top_p=0.95, max_tokens=6400)
    generate_args = dict(zip(FD_GENERATE_ARGS, (["The quick brown"], params, False)))
    out = llm.generate(**generate_args)[0]
    assert out.outputs.token_ids and len(out.prompt_token_ids) + len(out.outputs.token_ids) <= example["max_model_len"]
    chat_args = dict(zip(FD_CHAT_ARGS, ([{"role": "user", "content": "Hi"}], SamplingParams(top_p=0.95, max_tokens=8),
                                        False, {"enable_thinking": False})))
    assert llm.chat(**chat_args)[0].prompt.endswith("<|im_start|>assistant\n")


def test_fastdeploy_sampling_list(tiny):
    """Every SamplingParams field the FastDeploy pages list, at once, and their meaning where visible."""
    llm = build(tiny, **SMALL)
    out = run(llm, "The quick brown", SamplingParams(seed=3, **FD_SAMPLING_LIST)).outputs
    assert FD_SAMPLING_LIST["min_tokens"] <= len(out.token_ids) <= FD_SAMPLING_LIST["max_tokens"]
    tok = llm.get_tokenizer()
    for word in ("fox", " fox"):  # a bad word is never completed, with or without a leading space
        assert not contains(out.token_ids, tok.encode(word, add_special_tokens=False))
    top1 = run(llm, "The quick brown", SamplingParams(top_k=1, temperature=1.0, max_tokens=6, ignore_eos=True))
    greedy = run(llm, "The quick brown", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert top1.outputs.token_ids == greedy.outputs.token_ids  # top_k=1 keeps only the argmax
    for typo, field in FD_SAMPLING_TYPOS.items():
        with pytest.raises(TypeError, match=typo):
            SamplingParams(**{typo: 0.5})
        assert getattr(SamplingParams(**{field: 0.5}), field) == 0.5


# ---- vLLM ------------------------------------------------------------------------------------------
def test_vllm_llm_list_verbatim(tiny):
    llm = build(tiny, **VLLM_LLM_LIST)
    config = llm.llm_engine.config
    assert (config.scheduler_config.max_model_len, config.tensor_parallel_size) == (2048, 1)
    assert config.cache_config.gpu_memory_utilization == 0.9
    assert run(llm, "The quick", SamplingParams(temperature=0, max_tokens=3)).outputs.token_ids


@pytest.mark.parametrize("dtype", VLLM_DTYPES)
def test_vllm_dtypes(tiny, dtype):
    """A float32 checkpoint: "auto", "float16" and "float32" hold it in float32 (the KV cache follows),
    "bfloat16" in bf16 (where the compiled ops are built)."""
    from fastdeploy.model_executor.ops import compiled_op

    llm = build(tiny, dtype=dtype, **SMALL)
    bf16 = dtype == "bfloat16" and compiled_op("fd_packed_linear") is not None
    assert llm.llm_engine.config.cache_config.dtype == ("bfloat16" if bf16 else "float32")


def test_trust_remote_code_true_logs_once(tiny, caplog):
    from fastdeploy.engine import args_utils

    args_utils._note_no_remote_code.cache_clear()  # this process may have logged it already
    caplog.set_level(logging.INFO, logger="fastdeploy")
    for _ in range(2):
        build(tiny, trust_remote_code=True, **SMALL)
    notes = [r for r in caplog.records if "never runs code from a checkpoint" in r.getMessage()]
    assert len(notes) == 1 and "trust_remote_code=True" in notes[0].getMessage()


@pytest.mark.parametrize("kwargs,match", VLLM_REFUSED)
def test_vllm_values_this_engine_cannot_serve(no_loading, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(model="unused", **kwargs)


def test_vllm_sampling_list_verbatim(tiny):
    llm = build(tiny, **SMALL)
    out = run(llm, "The quick brown", SamplingParams(**VLLM_SAMPLING_LIST))
    assert len(out.outputs) == 1 and out.outputs.logprobs is None
    assert not any(stop in out.outputs.text for stop in VLLM_SAMPLING_LIST["stop"])  # cut at the first stop string
    several = run(llm, "Once upon a time", SamplingParams(**VLLM_SAMPLING_EXAMPLES[0]))
    assert [c.index for c in several.outputs] == [0, 1, 2] and all(len(c.token_ids) <= 50 for c in several.outputs)
    scored = run(llm, "The capital of France is", SamplingParams(**VLLM_SAMPLING_EXAMPLES[1]))
    assert scored.prompt_logprobs[0] is None and all(len(e) >= 5 for e in scored.prompt_logprobs[1:])
    assert all(5 <= len(e) <= 6 for e in scored.outputs.logprobs)


# ---- bad values of the accepted settings -------------------------------------------------------------
@pytest.mark.parametrize("kwargs,error,match", [
    (dict(use_warmup=2), ValueError, r"use_warmup must be 0, 1, False or True, got 2"),
    (dict(use_warmup="1"), ValueError, r"use_warmup must be .* got '1'"),
    (dict(port=0), ValueError, r"port must be an int in \[1, 65535\] or None, got 0"),
    (dict(metrics_port=65536), ValueError, r"metrics_port must be an int in \[1, 65535\] or None, got 65536"),
    (dict(port="8000"), ValueError, r"port must be an int in \[1, 65535\] or None, got '8000'"),
    (dict(port=True), ValueError, r"port must be .* got True"),
    (dict(engine_worker_queue_port="8002,x"), ValueError, r"engine_worker_queue_port must be an int in \[1, 65535\], "
                                                          r"a str of such ints separated by commas or None, got '8002,x'"),
    (dict(trust_remote_code="yes"), TypeError, r"trust_remote_code must be True or False, got 'yes'"),
    (dict(pipeline_parallel_size=0), ValueError, r"pipeline_parallel_size must be an int >= 1, got 0"),
    (dict(pipeline_parallel_size=True), ValueError, r"pipeline_parallel_size must be an int >= 1, got True"),
    (dict(dtype="half"), ValueError, r"dtype must be one of \['auto', 'bfloat16', 'float16', 'float32'\], got 'half'"),
])
def test_bad_values_name_field_value_and_allowed(no_loading, kwargs, error, match):
    with pytest.raises(error, match=match):
        LLM(model="unused", **kwargs)
