"""ERNIE-4.5-VL through the engine's runner (worker/multimodal.py): greedy tokens equal transformers'
`generate(do_sample=False)` on the tiny random checkpoint (tests/vl_helpers.py), with the image's
placeholder tokens prefilled whole or split across chunked-prefill steps, the encoder run once per
item; and with n-gram speculative decoding (drafts at M-RoPE positions past the prompt) the
logprobs of decoding without it.

The request is built directly on the engine side here (token ids, [3, n] positions, token types and
MultiModalFeatures computed with transformers' `get_rope_index` and random pixel values), so these
tests cover the runner and model apart from the input processor. Vision-expert ids (placeholders,
delimiters) are banned from generation on both sides: transformers routes generated tokens to the
text experts whatever their id, the engine by id.
"""
import numpy as np
import pytest
import torch

import vl_helpers
from fastdeploy import LLM, SamplingParams
from fastdeploy.input.input_processor import InputProcessor
from fastdeploy.multimodal.inputs import MultiModalFeature
from runner_access import model_runner

IDS = vl_helpers.TOKEN_IDS
IMAGE = IDS["image_token_id"]
VISION_IDS = sorted(IDS.values())
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = vl_helpers.build_tiny_vl(tmp_path_factory.mktemp("tiny_vl"))
    return directory, vl_helpers.load_hf_model(directory)


def _prompt(grids):
    ids = [1, 20, 30, 40]
    for k, (t, h, w) in enumerate(grids):
        ids += [IDS["image_start_token_id"]] + [IMAGE] * (h * w // 4) + [IDS["image_end_token_id"]] + [50 + k, 60]
    return ids + [70, 80]


def _hf_greedy(hf, ids, pixels, grids):
    input_ids = torch.tensor([ids])
    mm = (input_ids == IMAGE).int()
    moe = torch.isin(input_ids, torch.tensor(VISION_IDS)).int()
    hf.model.rope_deltas = None
    with torch.no_grad():
        positions, _ = hf.model.get_rope_index(input_ids, mm, image_grid_thw=torch.tensor(grids))
        out = hf.generate(input_ids=input_ids, pixel_values=torch.tensor(pixels), image_grid_thw=torch.tensor(grids),
                          mm_token_type_ids=mm, moe_mm_token_type_ids=moe, do_sample=False,
                          max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, suppress_tokens=VISION_IDS)
    hf.model.rope_deltas = None
    return out[0, len(ids):].tolist(), positions[:, 0].numpy()


def _features(ids, pixels, grids):
    features, row, offset = [], 0, 0
    for t, h, w in grids:
        offset = ids.index(IMAGE, offset)
        length = t * h * w // 4
        features.append(MultiModalFeature("image", offset, length, pixels[row : row + t * h * w], (t, h, w),
                                          f"item{offset}"))
        row, offset = row + t * h * w, offset + length
    return features


def _engine_greedy(llm, ids, positions, features, **extra):
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            bad_words_token_ids=VISION_IDS, **extra)
    # the text path of the input processor: this test places the items itself (random pixels)
    prepared = InputProcessor.process(engine.input_processor, None, ids, params)
    prepared.positions = positions  # [3, n]: what the input processor will compute
    request_id = engine.enqueue(prepared)
    request = engine.scheduler.requests[request_id]
    request.mm_features = features
    request.token_type_ids = (np.asarray(ids) == IMAGE).astype(np.int64)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    return outputs[0]


@pytest.mark.parametrize("chunk", [None, 8])  # 8: each image's placeholders are split across steps
def test_greedy_tokens_match_transformers(checkpoint, chunk):
    directory, hf = checkpoint
    grids = [(1, 4, 6), (1, 6, 4)]
    pixels = np.random.default_rng(0).standard_normal((48, 588)).astype(np.float32)
    ids = _prompt(grids)
    expected, positions = _hf_greedy(hf, ids, pixels, grids)
    llm = LLM(model=str(directory), max_model_len=256, block_size=16, num_gpu_blocks_override=32, max_num_seqs=4,
              enable_chunked_prefill=chunk is not None, max_num_batched_tokens=chunk, enable_prefix_caching=False)
    runner = model_runner(llm)
    calls = []
    encode = runner.model.embed_multimodal
    runner.model.embed_multimodal = lambda features: calls.append(len(features)) or encode(features)
    tokens = _engine_greedy(llm, ids, positions, _features(ids, pixels, grids)).outputs.token_ids
    assert tokens == expected
    assert len(set(tokens)) > 2  # the continuation varies
    assert sum(calls) == 2  # each image encoded once, however its tokens were split
    if chunk is not None:
        assert len(calls) == 2  # the chunks reached the second image in a later step
    assert not any(state.encoder_outputs for state in runner.requests.values())
    llm.shutdown()


def test_speculative_decoding_keeps_the_logprobs(checkpoint):
    """A logit bias towards three prompt tokens makes the continuation repeat them, so n-gram lookup
    drafts from step 2 on; every emitted token's logprob (raw: before the bias) is the one of decoding
    without speculation, which a wrong M-RoPE position of a draft row would change."""
    directory, _ = checkpoint
    grids = [(1, 4, 6)]
    pixels = np.random.default_rng(1).standard_normal((24, 588)).astype(np.float32)
    ids = _prompt(grids)
    _, positions = _hf_greedy(checkpoint[1], ids, pixels, grids)
    extra = dict(logit_bias={20: 8.0, 30: 8.0, 40: 8.0}, logprobs=1)
    outputs = []
    for spec in (None, {"method": "ngram", "num_speculative_tokens": 3, "min_ngram_size": 1, "max_ngram_size": 2}):
        llm = LLM(model=str(directory), max_model_len=256, block_size=16, num_gpu_blocks_override=32, max_num_seqs=4,
                  enable_prefix_caching=False, speculative_config=spec)
        outputs.append(_engine_greedy(llm, ids, positions, _features(ids, pixels, grids), **extra))
        llm.shutdown()
    plain, ours = outputs
    assert ours.outputs.token_ids == plain.outputs.token_ids
    for a, b, token in zip(ours.outputs.logprobs, plain.outputs.logprobs, plain.outputs.token_ids):
        assert a[token].logprob == pytest.approx(b[token].logprob, abs=1e-4)
    assert ours.metrics.num_accepted_tokens > 0, (plain.outputs.token_ids, ours.metrics.num_draft_tokens)
