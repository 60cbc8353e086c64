"""The pooling API's contract: runner / convert / task resolution, clear errors for bad settings and bad input
(raised before any request is queued), outputs in input order, many prompts packed into one step and their KV
blocks freed at once."""
import json

import numpy as np
import pytest
import torch

from fastdeploy import LLM, PoolingParams, SamplingParams
from helpers import assert_engine_idle
from pooling_checkpoints import make_qwen3_embedding
from tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    path, _ = make_qwen3_embedding(tmp_path_factory.mktemp("embedder"))
    return LLM(str(path), dtype="float32")


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("causal")
    make_tiny_model(path, "qwen3")
    return path


def test_runner_resolution(causal_dir, embedder):
    assert embedder.llm_engine.config.runner == "pooling"  # modules.json
    generative = LLM(str(causal_dir), max_model_len=128)
    assert generative.llm_engine.config.runner == "generate" and generative.llm_engine.config.pooler_config is None
    with pytest.raises(ValueError, match=r"LLM.embed needs a pooling model.*runner='pooling'"):
        generative.embed(["hi"])
    with pytest.raises(ValueError, match=r"LLM.generate generates text, but this LLM runs a pooling model"):
        embedder.generate(["hi"], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"LLM.chat generates text"):
        embedder.chat([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match=r"LLM.classify runs task 'classify', which this 'embed' model does not serve"):
        embedder.classify(["hi"])


def test_a_causal_lm_converted_to_embed_pools_its_last_token(causal_dir):
    from transformers import AutoModel, AutoTokenizer

    llm = LLM(str(causal_dir), convert="embed", dtype="float32", max_model_len=128)
    config = llm.llm_engine.config.pooler_config
    assert (config.task, config.pooling_type, config.normalize) == ("embed", "LAST", True)
    tok = AutoTokenizer.from_pretrained(str(causal_dir))
    hf = AutoModel.from_pretrained(str(causal_dir), dtype=torch.float32).eval()
    text = "The quick brown fox"
    with torch.no_grad():
        last = hf(torch.tensor([tok(text)["input_ids"]])).last_hidden_state[0, -1].numpy()
    np.testing.assert_allclose(llm.embed(text, use_tqdm=False)[0].outputs.data, last / np.linalg.norm(last),
                               rtol=1e-4, atol=1e-5)
    same = LLM(str(causal_dir), task="embed", override_pooler_config={"pooling_type": "MEAN"}, max_model_len=128)
    assert same.llm_engine.config.pooler_config.pooling_type == "MEAN"  # FastDeploy's name of pooler_config


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(runner="pool"), ValueError, r"runner must be one of \['auto', 'generate', 'pooling'\], got 'pool'"),
    (dict(convert="rerank"), ValueError, r"convert must be one of .*got 'rerank'"),
    (dict(runner="generate", task="embed"), ValueError, r"runner='generate' cannot run task='embed'"),
    (dict(task="classify", convert="embed"), ValueError, r"task='classify' conflicts with convert='embed'"),
    (dict(task="embed", pooler_config={"pooling": "CLS"}), ValueError, r"pooler_config has unknown key\(s\) \['pooling'\]"),
    (dict(task="embed", pooler_config={"pooling_type": "MAX"}), ValueError, r"pooling_type must be one of"),
    (dict(task="embed", pooler_config={"normalize": "yes"}), TypeError, r"pooler_config normalize must be True or False"),
    (dict(task="embed", pooler_config={}, override_pooler_config={}), ValueError, r"give one"),
    (dict(task="embed", enable_chunked_prefill=True), ValueError, r"a pooling model computes each prompt in one step"),
    (dict(task="embed", pooler_config={"pooling_type": "ALL"}), ValueError, r"pooling_type 'ALL' gives one vector per token"),
    (dict(hf_overrides=["x"]), TypeError, r"hf_overrides must be a dict"),
])
def test_bad_settings_are_named(causal_dir, kwargs, error, match):
    with pytest.raises(error, match=match):
        LLM(str(causal_dir), max_model_len=128, **kwargs)


def test_an_unsupported_sentence_transformers_module_is_named(tmp_path):
    path, _ = make_qwen3_embedding(tmp_path)
    modules = json.loads((path / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"module 'sentence_transformers.models.Dense' is not supported"):
        LLM(str(path))


@pytest.mark.parametrize("make, error, match", [
    (lambda: PoolingParams(dimensions=0), ValueError, r"dimensions must be an int >= 1 or None, got 0"),
    (lambda: PoolingParams(normalize="yes"), TypeError, r"normalize must be True, False or None"),
    (lambda: PoolingParams(truncate_prompt_tokens=0), ValueError, r"truncate_prompt_tokens must be an int >= 1, -1"),
    (lambda: PoolingParams(task="rank"), ValueError, r"task must be one of"),
])
def test_pooling_params_validate_their_fields(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("call, error, match", [
    (lambda llm: llm.embed(["ok", []]), ValueError, r"prompt is empty \(prompt 1\)"),
    (lambda llm: llm.embed(["ok", [10**6]]), ValueError, r"prompt token id 1000000 \(prompt 1\) is outside the vocabulary"),
    (lambda llm: llm.embed(["ok", "x " * 600]), ValueError, r"prompt 1 has \d+ tokens, above max_model_len=256"),
    (lambda llm: llm.embed(["ok"], PoolingParams(activation=True)), ValueError, r"task 'embed' reads \['dimensions', 'normalize'\]"),
    (lambda llm: llm.embed(["ok"], PoolingParams(task="score")), ValueError, r"pooling_params.task='score'"),
    (lambda llm: llm.embed(["a", "b"], [PoolingParams()]), ValueError, r"2 prompts, 1 pooling_params"),
    (lambda llm: llm.embed(["a"], truncate_prompt_tokens=1000), ValueError, r"truncate_prompt_tokens=1000 exceeds max_model_len=256"),
    (lambda llm: llm.score(["a", "b"], ["c", "d", "e"]), ValueError, r"got 2 and 3 texts"),
    (lambda llm: llm.score([], "a"), ValueError, r"text_1 is empty"),
    (lambda llm: llm.score("a", [1, 2]), TypeError, r"text_2 must be a str or a list of str"),
    (lambda llm: llm.embed(["ok", "bad \ud800"]), ValueError, r"prompt 1 holds the lone surrogate"),
])
def test_bad_input_is_refused_before_anything_runs(embedder, call, error, match):
    with pytest.raises(error, match=match):
        call(embedder)
    assert_engine_idle(embedder)
    assert not embedder.llm_engine.output_processor.pooling


def test_many_short_texts_share_one_step_and_free_their_blocks(embedder):
    texts = [f"text number {i} about a fox" for i in range(300)]
    engine = embedder.llm_engine
    steps = []
    original = engine.step
    engine.step = lambda: steps.append(1) or original()
    try:
        outs = embedder.embed(texts, use_tqdm=False)
    finally:
        del engine.step
    assert len(steps) == 2  # 256 requests (max_num_seqs' pooling default) in the first step, 44 in the second
    alone = embedder.embed(texts[7], use_tqdm=False)[0]
    assert outs[7].prompt_token_ids == alone.prompt_token_ids  # input order kept
    np.testing.assert_allclose(outs[7].outputs.data, alone.outputs.data, rtol=1e-5, atol=1e-6)
    assert_engine_idle(embedder)


def test_truncation_keeps_the_special_tokens(embedder):
    tok = embedder.get_tokenizer()
    out = embedder.embed(["the quick brown fox " * 30], PoolingParams(truncate_prompt_tokens=10), use_tqdm=False)[0]
    assert len(out.prompt_token_ids) == 10 and out.prompt_token_ids[-1] == tok.convert_tokens_to_ids("<|endoftext|>")
    ids = list(range(3, 40))
    assert embedder.embed([ids], truncate_prompt_tokens=5, use_tqdm=False)[0].prompt_token_ids == ids[:5]


def test_kv_pool_holds_one_step_of_pooling_prompts(embedder):
    sc, cc = embedder.llm_engine.config.scheduler_config, embedder.llm_engine.config.cache_config
    # requests live one step: at most the step's tokens in whole blocks, plus a part-full block each
    assert cc.num_blocks <= -(-sc.max_num_batched_tokens // cc.block_size) + sc.max_num_seqs + 1


def test_warm_up_runs_pooled_prompts(tmp_path):
    path, st = make_qwen3_embedding(tmp_path)
    llm = LLM(str(path), dtype="float32", use_warmup=1, max_num_seqs=4)
    assert_engine_idle(llm)
    ref = st.encode(["Hello world!"], convert_to_numpy=True)[0]
    assert np.dot(llm.embed("Hello world!", use_tqdm=False)[0].outputs.data, ref) >= 0.99999


def test_tensor_parallel_pooling_is_refused_before_any_worker_starts(tmp_path):
    path, _ = make_qwen3_embedding(tmp_path)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2: pooling models run in one process"):
        LLM(str(path), tensor_parallel_size=2)
