"""Greedy chat on the default model (SmolLM2-135M-Instruct Q4_1 GGUF) against transformers.

Oracle: transformers' LlamaForCausalLM loaded from the same GGUF (dequantized to float32), greedy,
one prompt at a time without padding. Our engine runs the same prompt token ids once as one batch
and once one by one; token ids must be identical. Tolerance: where the oracle's top-2 logit gap is
below 1e-3 at a position, float32 rounding may legitimately pick the other token, so a divergence
is accepted from that position on (and only there).
"""
import pytest
import torch

from fastdeploy import SamplingParams

MAX_TOKENS = 48
NEAR_TIE = 1e-3

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain photosynthesis in one sentence.",
    "用一句话介绍长城。",
    "把李白的静夜思改写为现代诗",
    "Write a Python function that returns the factorial of n.",
    "What does `git rebase` do?",
    "Translate 'good morning' into Spanish and German.",
    "List three prime numbers greater than 50.",
    "def add(a, b):\n    # complete this function",
    "Why is the sky blue?",
    "Give me a short tip for learning to cook.",
]


def reference_greedy(hf, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and, at each generated position, the top-2 logit gap."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=MAX_TOKENS,
                          output_logits=True, return_dict_in_generate=True, eos_token_id=2)
    tokens = out.sequences[0, len(prompt_ids):].tolist()
    gaps = []
    for logits in out.logits:
        top2 = torch.topk(logits[0].float(), 2).values
        gaps.append(float(top2[0] - top2[1]))
    return tokens, gaps


def assert_same_greedy(ours: list[int], ref: list[int], gaps: list[float]) -> None:
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            assert gaps[i] < NEAR_TIE, f"token {i}: ours {a}, transformers {b}, top-2 gap {gaps[i]:.2e}"
            return  # a near-tie: the continuations may differ from here on
    assert len(ours) == len(ref), f"lengths differ: ours {len(ours)}, transformers {len(ref)}"


@pytest.fixture(scope="module")
def chat_prompts(smollm_llm):
    tokenizer = smollm_llm.get_tokenizer()
    prompts = []
    for question in QUESTIONS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


@pytest.fixture(scope="module")
def references(smollm_hf, chat_prompts):
    return [reference_greedy(smollm_hf, p) for p in chat_prompts]


def test_greedy_batched_matches_transformers(smollm_llm, chat_prompts, references):
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    outputs = smollm_llm.generate([{"prompt_token_ids": p} for p in chat_prompts], params, use_tqdm=False)
    for output, (ref, gaps) in zip(outputs, references):
        assert_same_greedy(output.outputs.token_ids, ref, gaps)


def test_greedy_one_by_one_matches_transformers(smollm_llm, chat_prompts, references):
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    for prompt, (ref, gaps) in zip(chat_prompts, references):
        output = smollm_llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
        assert_same_greedy(output.outputs.token_ids, ref, gaps)


def test_chat_renders_the_same_prompt_ids(smollm_llm, chat_prompts):
    """LLM.chat must tokenize the rendered template exactly as the test's prompts above."""
    params = SamplingParams(temperature=0, max_tokens=1)
    outputs = smollm_llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS], params, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == chat_prompts
    assert outputs[0].prompt.endswith("<|im_start|>assistant\n")
