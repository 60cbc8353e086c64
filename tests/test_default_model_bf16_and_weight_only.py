"""bf16 and weight-only int8/int4 on real weights: the default model, dequantized to an HF fp32 checkpoint.

The checkpoint: transformers loads SmolLM2-135M-Instruct's GGUF (dequantized to float32; the session's
oracle model) and this module saves it as an HF directory with its tokenizer. Oracle: transformers
float32 on the same weights. Our `dtype="bfloat16"` may leave float32's 16 greedy tokens only at bf16
near-ties and must give them exactly on most of 32 chat prompts; the perplexity of a fixed English text
under `quantization="wint8"` / `"wint4"` must be within 1% / 5% of float32's.

transformers bf16 agrees with transformers float32 on only 20 of these 32 prompts: bf16 moves logprobs by
a few hundredths, so wherever float32's two best candidates are that close, either may come out. Ours holds
the weights and the KV cache in bf16 and rounds each matmul's input to bf16, everything else float32; the
count of exact agreements therefore depends on the CPU and on the batch (the kernels' summation order
differs by a float32 ulp between row blocks, and rounding an activation to bf16 turns that into a bf16 ulp
now and then). Measured: 29-31 of 32 on an Intel Xeon with AMX; on an AMD EPYC Zen 4 (AVX512-BF16) 26 in
one batch of 32 and 28 prompt by prompt, every divergence at a float32 logprob gap of 0.055 or less. So the
test asks what holds on every CPU: ours diverges from float32 only at such bf16 near-ties (the float32 gap
between its token and ours at the first difference below BF16_NEAR_TIE), and agrees exactly on most prompts.
A kernel that computed another function diverges where float32 is sure. A bar against transformers bf16
would reward reproducing its errors (it runs every op in bf16: the residual stream, norms, attention), so
the oracle is float32.
"""
import copy

import numpy as np
import pytest
import torch

from fastdeploy import LLM, SamplingParams

from helpers import run
from test_default_model_greedy import QUESTIONS

NEW_TOKENS = 16
BF16_NEAR_TIE = 0.1  # float32 logprob gap below which bf16 rounding may pick either token (seen: <= 0.055)
MOST_AGREE = 24  # of 32 exactly equal (transformers bf16: 20)
TEXT = ("The history of bread goes back at least thirty thousand years. Early people ground wild grains "
        "between stones, mixed the flour with water and baked the paste on hot rocks. When farmers in the "
        "Fertile Crescent began to grow wheat and barley, bread became a daily food. The Egyptians learned "
        "that dough left in a warm place would rise, because wild yeast in the air fed on the sugars in the "
        "flour and made bubbles of gas. Roman bakers built large ovens and sold loaves in the street, and "
        "in the Middle Ages every town had its own baker, whose prices were set by law.")


@pytest.fixture(scope="module")
def hf_dir(smollm_hf, smollm_path, tmp_path_factory):
    """The default model as an HF float32 directory (config, safetensors, tokenizer)."""
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("smollm2_hf")
    config = copy.deepcopy(smollm_hf.config)
    config.quantization_config = None  # a GGUF-loaded model refuses save_pretrained; rebuild it plainly
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(smollm_hf.state_dict())
    plain.save_pretrained(str(path))
    AutoTokenizer.from_pretrained(os.path.dirname(smollm_path),
                                  gguf_file=os.path.basename(smollm_path)).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def chat_prompts(tok):
    prompts = []
    for i in range(32):
        question = QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" (take {i // len(QUESTIONS)})")
        text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                       add_generation_prompt=True)
        prompts.append(tok.encode(text, add_special_tokens=False))
    return prompts


@pytest.fixture(scope="module")
def float32_greedy(smollm_hf, chat_prompts):
    """transformers float32's 16 greedy tokens for each chat prompt (EOS ignored)."""
    with torch.no_grad():
        return [smollm_hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                   eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
                for prompt in chat_prompts]


def float32_gap(smollm_hf, prompt: list[int], reference: list[int], ours: list[int]) -> float:
    """At the first position where ours leaves the float32 greedy continuation: float32's logprob of its
    own token minus its logprob of ours (0 when they never differ)."""
    i = next((i for i, (a, b) in enumerate(zip(reference, ours)) if a != b), None)
    if i is None:
        return 0.0
    with torch.no_grad():
        logits = smollm_hf(torch.tensor([prompt + reference[:i]])).logits[0, -1].double()
    logprobs = torch.log_softmax(logits, -1)
    return float(logprobs[reference[i]] - logprobs[ours[i]])


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_bf16_greedy_matches_transformers_float32(source, hf_dir, smollm_path, smollm_hf, chat_prompts,
                                                  float32_greedy):
    """From the HF float32 directory, and from the GGUF file itself (its Q4_1 blocks dequantized at load,
    the same float values transformers dequantizes, then held in bf16): all 32 prompts in one batch."""
    model = str(hf_dir) if source == "hf" else smollm_path
    llm = LLM(model=model, dtype="bfloat16", max_model_len=512, max_num_seqs=32)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    ours = [o.outputs.token_ids for o in run(llm, chat_prompts, params)]
    del llm
    gaps = [float32_gap(smollm_hf, prompt, ref, got) for prompt, ref, got in zip(chat_prompts, float32_greedy, ours)]
    sure = [(i, round(gap, 3)) for i, gap in enumerate(gaps) if gap >= BF16_NEAR_TIE]
    assert not sure, f"(prompt, float32 gap) where ours left a float32 greedy token that was not a near-tie: {sure}"
    same = sum(a == b for a, b in zip(ours, float32_greedy))
    assert same >= MOST_AGREE, f"{same} of 32 greedy continuations equal transformers float32"


def perplexity_of(llm, ids: list[int]) -> float:
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)[0]
    logprobs = [entry[token].logprob for token, entry in zip(ids[1:], out.prompt_logprobs[1:])]
    return float(np.exp(-np.mean(logprobs)))


@pytest.mark.parametrize("quantization,tolerance", [("wint8", 0.01), ("wint4", 0.05)])
def test_weight_only_perplexity_is_close_to_float32(hf_dir, smollm_hf, tok, quantization, tolerance):
    ids = tok.encode(TEXT, add_special_tokens=False)
    with torch.no_grad():
        logits = smollm_hf(torch.tensor([ids])).logits[0].double()
    ref = float(torch.exp(-torch.log_softmax(logits[:-1], -1)[torch.arange(len(ids) - 1), ids[1:]].mean()))
    llm = LLM(model=str(hf_dir), quantization=quantization, max_model_len=512)
    ours = perplexity_of(llm, ids)
    assert abs(ours / ref - 1) <= tolerance, f"{quantization}: perplexity {ours:.3f} vs float32 {ref:.3f}"
