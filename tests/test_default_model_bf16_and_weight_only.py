"""bf16 and weight-only int8/int4 on real weights: the default model, dequantized to an HF fp32 checkpoint.

The checkpoint: transformers loads SmolLM2-135M-Instruct's GGUF (dequantized to float32; the session's
oracle model) and this module saves it as an HF directory with its tokenizer. Oracle: transformers
float32 on the same weights. Our `dtype="bfloat16"` must give its 16 greedy tokens on >= 28 of 32 chat
prompts; the perplexity of a fixed English text under `quantization="wint8"` / `"wint4"` must be within
1% / 5% of its.

bf16 greedy equal to transformers *bf16* on 28 of 32 was the first idea; measured here (2026-11-24):
transformers bf16 agrees with transformers float32 on 20 of these 32 prompts, ours bf16 on 31, and
ours bf16 with transformers bf16 on 19 (2026-11-26, with the KV cache in bf16 too: ours bf16 on 29,
from the HF directory and from the GGUF file alike, as the float32 cache gave in the same run).
transformers bf16 runs every op in bf16 (the residual stream, norms, attention, the KV cache); ours
holds the weights and the KV cache in bf16 and rounds each matmul's input, everything else float32.
A bar against transformers bf16 would reward reproducing its errors, so the oracle is float32 and the
bar that count.
"""
import copy

import numpy as np
import pytest
import torch

from fastdeploy import LLM, SamplingParams

from helpers import run
from test_default_model_greedy import QUESTIONS

NEW_TOKENS = 16
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


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_bf16_greedy_matches_transformers_float32(source, hf_dir, smollm_path, chat_prompts, float32_greedy):
    """From the HF float32 directory, and from the GGUF file itself (its Q4_1 blocks dequantized at load,
    the same float values transformers dequantizes, then held in bf16)."""
    model = str(hf_dir) if source == "hf" else smollm_path
    llm = LLM(model=model, dtype="bfloat16", max_model_len=512, max_num_seqs=32)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    ours = [o.outputs.token_ids for o in run(llm, chat_prompts, params)]
    del llm
    same = sum(a == b for a, b in zip(ours, float32_greedy))
    assert same >= 28, f"{same} of 32 greedy continuations equal transformers float32"


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
