"""The Qwen3 tokenizer loaded offline from its model directory (tokenizer_loader.load_model_tokenizer).

The directory is built here and mimics the real one: a byte-level BPE with Qwen2's pre-tokenizer
regex, tokenizer.json and/or vocab.json + merges.txt, Qwen3's added tokens (`<|endoftext|>`,
`<|im_start|>`, `<|im_end|>` special; `<think>`, `</think>` not) and Qwen3's `enable_thinking` switch.
The oracle is the `tokenizers` object trained here.
"""
import json
from pathlib import Path

import pytest

from fastdeploy.input.tokenizer_loader import load_model_tokenizer

from tokenizer_dirs import CORPUS, MESSAGES, TEXTS


QWEN_PRETOKENIZE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                    r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
              ("<think>", False), ("</think>", False)]
# Qwen3's template, reduced to the parts that matter here (the generation prompt and its thinking switch).
QWEN_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
QWEN_PROMPT = "<|im_start|>user\nWhat is 2+2? 请回答。<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def qwen_ref():
    """A byte-level BPE like Qwen's tokenizer.json (NFC, Qwen2's split regex, ByteLevel), with Qwen3's added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    for content, special in QWEN_ADDED:
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    return tok


def write_qwen_tokenizer(path: Path, ref, files: str, model_type: str = "qwen3") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    base = ref.get_vocab_size(with_added_tokens=False)
    if files in ("tokenizer.json", "both"):
        ref.save(str(path / "tokenizer.json"))
    if files in ("vocab+merges", "both"):
        ref.model.save(str(path))  # vocab.json, merges.txt
    config = {
        "add_bos_token": False, "add_prefix_space": False, "errors": "replace", "model_max_length": 131072,
        "added_tokens_decoder": {str(base + i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                                 "single_word": False, "special": s}
                                 for i, (c, s) in enumerate(QWEN_ADDED)},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "chat_template": QWEN_TEMPLATE, "clean_up_tokenization_spaces": False, "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    architecture = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[model_type]
    (path / "config.json").write_text(json.dumps({"architectures": [architecture], "model_type": model_type}))
    return path


@pytest.fixture(scope="module", params=[("tokenizer.json", "qwen3"), ("vocab+merges", "qwen3"), ("both", "qwen3"),
                                        ("vocab+merges", "qwen2")], ids="-".join)
def qwen_tok(request, qwen_ref, tmp_path_factory):
    return load_model_tokenizer(write_qwen_tokenizer(tmp_path_factory.mktemp("qwen"), qwen_ref, *request.param))


@pytest.mark.parametrize("text", TEXTS + [QWEN_PROMPT])
def test_qwen_encodes_like_its_tokenizer_json(qwen_tok, qwen_ref, text):
    ids = qwen_tok.encode(text, add_special_tokens=False)
    assert ids == qwen_ref.encode(text, add_special_tokens=False).ids
    assert qwen_tok.encode(text) == ids, "Qwen adds no BOS"
    assert qwen_tok.decode(ids) == text


def test_qwen_special_tokens(qwen_tok, qwen_ref):
    base = qwen_ref.get_vocab_size(with_added_tokens=False)
    assert qwen_tok.convert_tokens_to_ids([c for c, _ in QWEN_ADDED]) == list(range(base, base + len(QWEN_ADDED)))
    assert qwen_tok.eos_token == "<|im_end|>" and qwen_tok.eos_token_id == base + 2
    assert qwen_tok.pad_token == "<|endoftext|>" and qwen_tok.bos_token is None
    ids = qwen_tok.encode(QWEN_PROMPT + "<think>\n想一想\n</think>\n\n4 🦙<|im_end|>", add_special_tokens=False)
    assert qwen_tok.decode(ids, skip_special_tokens=False).endswith("<|im_end|>")
    # <think> is not special in Qwen3, so it survives skip_special_tokens
    assert qwen_tok.decode(ids, skip_special_tokens=True) == \
        "user\nWhat is 2+2? 请回答。\nassistant\n<think>\n想一想\n</think>\n\n4 🦙"


def test_qwen_chat_template_honours_enable_thinking(qwen_tok):
    def apply(**kwargs):
        return qwen_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, **kwargs)

    assert apply(enable_thinking=False) == QWEN_PROMPT + "<think>\n\n</think>\n\n"
    assert apply(enable_thinking=True) == QWEN_PROMPT
    assert apply() == QWEN_PROMPT

