"""Greedy chat on the default model (SmolLM2-135M-Instruct Q4_1 GGUF) against transformers.

Oracle: transformers' LlamaForCausalLM loaded from the same GGUF (dequantized to float32), greedy,
one prompt at a time without padding. Our engine runs the same prompt token ids once as one batch
and once one by one; token ids must be identical. Tolerance: where the oracle's top-2 logit gap is
below 1e-3 at a position, float32 rounding may legitimately pick the other token, so a divergence
is accepted from that position on (and only there).
"""
import pytest
import torch

from helpers import assert_same_greedy, chat, greedy, run

MAX_TOKENS = 48

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


def reference_greedy(hf, prompt_ids: list[int], eos: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and, at each generated position, the top-2 logit gap."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=MAX_TOKENS,
                          output_logits=True, return_dict_in_generate=True, eos_token_id=eos)
    tokens = out.sequences[0, len(prompt_ids):].tolist()
    gaps = []
    for logits in out.logits:
        top2 = torch.topk(logits[0].float(), 2).values
        gaps.append(float(top2[0] - top2[1]))
    return tokens, gaps


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
def references(smollm_hf, chat_prompts, tok):
    return [reference_greedy(smollm_hf, p, tok.eos_token_id) for p in chat_prompts]


def test_greedy_batched_matches_transformers(smollm_llm, chat_prompts, references):
    outputs = run(smollm_llm, chat_prompts, greedy(MAX_TOKENS))
    for i, (output, (ref, gaps)) in enumerate(zip(outputs, references)):
        assert_same_greedy(output.outputs.token_ids, ref, gaps, f"question {i}:")


def test_greedy_one_by_one_matches_transformers(smollm_llm, chat_prompts, references):
    for i, (prompt, (ref, gaps)) in enumerate(zip(chat_prompts, references)):
        output = run(smollm_llm, {"prompt_token_ids": prompt}, greedy(MAX_TOKENS))[0]
        assert_same_greedy(output.outputs.token_ids, ref, gaps, f"question {i}:")


def test_chat_renders_the_same_prompt_ids(smollm_llm, chat_prompts, tok):
    """LLM.chat must tokenize the rendered template exactly as the test's prompts above, with the
    generation prompt (the rendering differs from the one without it by a suffix)."""
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS]
    outputs = chat(smollm_llm, conversations, greedy(1))
    assert [o.prompt_token_ids for o in outputs] == chat_prompts
    bare = tok.apply_chat_template(conversations[0], tokenize=False, add_generation_prompt=False)
    assert outputs[0].prompt.startswith(bare) and len(outputs[0].prompt) > len(bare)
