"""Tokenizers of the model zoo loaded offline from the model directory (tokenizer_loader.load_model_tokenizer).

The directories are built here and mimic the real ones:
- ERNIE-4.5: a sentencepiece BPE `tokenizer.model` trained on English + Chinese with ERNIE's
  settings as transformers' port converted them (no dummy prefix, spaces kept, byte fallback) and
  ERNIE's special pieces; a tokenizer_config.json shaped like Baidu's (class `Ernie4_5_Tokenizer` /
  `Ernie4_5Tokenizer` with an `auto_map` to a remote `tokenization_ernie4_5.py` that must never run,
  cls `<|begin_of_sentence|>`, sep `<|end_of_sentence|>`, mask and the `sys_*` / `header_*` tokens);
  an ERNIE-style chat template (inline or chat_template.jinja) that honours `enable_thinking`.
  The oracle is sentencepiece itself on the same model file.
- Qwen3: a byte-level BPE with Qwen2's pre-tokenizer regex, tokenizer.json and/or vocab.json +
  merges.txt, Qwen3's added tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>` special; `<think>`,
  `</think>` not) and Qwen3's `enable_thinking` switch. The oracle is the `tokenizers` object trained here.
"""
import io
import json
from pathlib import Path

import pytest

from fastdeploy.model_executor.model_loader.tokenizer_loader import load_model_tokenizer

TEXTS = [
    "Hello world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "你好，世界！这是一个中文句子。",
    "ERNIE 4.5 模型 supports 中文 and English, 3.14 and 42.",
    "emoji 🦙🦙 👍🏽 ❤️ 👨‍👩‍👧",
    "  two  spaces\tand\ttabs\nnew line  ",
    "Ünïcödé àccents — “quotes” …",
    "",
]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today? I am fine, thank you.",
    "Machine learning models generate text one token at a time.",
    "你好，世界！这是一个中文句子。",
    "我们今天去公园散步，天气很好。",
    "深度学习模型逐个生成文本，速度很快。",
    "def add(a, b):\n    return a + b",
    "Numbers like 1234567890 and 3.14 appear in text.",
]
MESSAGES = [{"role": "user", "content": "What is 2+2? 请回答。"}]

# ---- ERNIE-4.5 ---------------------------------------------------------------------------------
ERNIE_PIECES = (["<|begin_of_sentence|>", "<|end_of_sentence|>", "<cls>", "<sep>", "<pad>"]
                + [f"<mask:{i}>" for i in range(8)]
                + ["<|im_start|>", "<|im_end|>", "<think>", "</think>"])
# ERNIE's chat template (tokenizer_config.json of the 0.3B repos) with a thinking switch after
# "Assistant: " in the style of the thinking-capable templates.
ERNIE_TEMPLATE = (
    '{%- if not add_generation_prompt is defined -%}{%- set add_generation_prompt = true -%}{%- endif -%}\n'
    '{%- if not cls_token is defined -%}{%- set cls_token = "<|begin_of_sentence|>" -%}{%- endif -%}\n'
    '{%- if not sep_token is defined -%}{%- set sep_token = "<|end_of_sentence|>" -%}{%- endif -%}\n'
    '{{- cls_token -}}\n'
    '{%- for message in messages -%}\n'
    '    {%- if message["role"] == "user" -%}{{- "User: " + message["content"] + "\\n" -}}\n'
    '    {%- elif message["role"] == "assistant" -%}{{- "Assistant: " + message["content"] + sep_token -}}\n'
    '    {%- elif message["role"] == "system" -%}{{- message["content"] + "\\n" -}}\n'
    '    {%- endif -%}\n'
    '{%- endfor -%}\n'
    '{%- if add_generation_prompt -%}\n'
    '    {{- "Assistant: " -}}\n'
    '    {%- if enable_thinking is defined and not enable_thinking -%}{{- "<think>\\n\\n</think>\\n\\n" -}}\n'
    '    {%- else -%}{{- "<think>\\n" -}}{%- endif -%}\n'
    '{%- endif -%}'
)
ERNIE_PROMPT = "<|begin_of_sentence|>User: What is 2+2? 请回答。\nAssistant: "
# The remote tokenizer code the repos ship; loading must never import it.
REMOTE_CODE = "import pathlib\npathlib.Path(__file__).with_name('REMOTE_CODE_RAN').write_text('yes')\n"


def train_sentencepiece(model_type="bpe", vocab_size=600, ernie=True) -> bytes:
    import sentencepiece as spm

    settings = dict(normalization_rule_name="identity", add_dummy_prefix=False, remove_extra_whitespaces=False,
                    user_defined_symbols=ERNIE_PIECES) if ernie else \
        dict(normalization_rule_name="nmt_nfkc", add_dummy_prefix=True, remove_extra_whitespaces=True,
             control_symbols=["<cls>", "<sep>"], user_defined_symbols=["<mask:0>", "<mask:1>"])
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20), model_writer=model, vocab_size=vocab_size, model_type=model_type,
        byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        hard_vocab_limit=False, minloglevel=2, **settings,
    )
    return model.getvalue()


def ernie_tokenizer_config(layout: str) -> dict:
    """Layout "inline": the first releases' tokenizer_config.json; "jinja": chat_template.jinja, added_tokens."""
    config = {
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<unk>", "unk_token": "<unk>",
        "cls_token": "<|begin_of_sentence|>", "sep_token": "<|end_of_sentence|>", "mask_token": "<mask:1>",
        "sys_start_token": "<mask:4>", "sys_end_token": "<mask:5>",
        "header_start_token": "<mask:6>", "header_end_token": "<mask:7>",
        "additional_special_tokens": None,
        "tokenizer_class": "Ernie4_5_Tokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_ernie4_5.Ernie4_5_Tokenizer", None]},
        "chat_template": ERNIE_TEMPLATE,
    }
    if layout == "jinja":
        del config["chat_template"]
        config.update(tokenizer_class="Ernie4_5Tokenizer", legacy=True, add_bos_token=False,
                      clean_up_tokenization_spaces=False, spaces_between_special_tokens=False,
                      auto_map={"AutoTokenizer": ["tokenization_ernie4_5.Ernie4_5Tokenizer", None]})
    return config


def write_ernie_tokenizer(path: Path, spm_model: bytes, layout: str = "inline", config_json: bool = True) -> Path:
    import sentencepiece as spm

    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.model").write_bytes(spm_model)
    config = ernie_tokenizer_config(layout)
    if layout == "jinja":
        sp = spm.SentencePieceProcessor(model_proto=spm_model)
        config["added_tokens_decoder"] = {
            str(sp.piece_to_id(piece)): {"content": piece, "lstrip": False, "normalized": False, "rstrip": False,
                                         "single_word": False, "special": special}
            for piece, special in [("<|begin_of_sentence|>", True), ("<|end_of_sentence|>", True),
                                   ("<think>", False), ("</think>", False)]
        }
        (path / "chat_template.jinja").write_text(ERNIE_TEMPLATE, encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (path / "special_tokens_map.json").write_text(json.dumps(
        {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token", "cls_token", "sep_token",
                                "mask_token")}, indent=2))
    (path / "tokenization_ernie4_5.py").write_text(REMOTE_CODE)
    if config_json and not (path / "config.json").exists():
        (path / "config.json").write_text(json.dumps({"architectures": ["Ernie4_5ForCausalLM"],
                                                      "model_type": "ernie4_5"}))
    return path


@pytest.fixture(scope="module")
def ernie_spm() -> bytes:
    return train_sentencepiece()


@pytest.fixture(scope="module")
def sp(ernie_spm):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=ernie_spm)


@pytest.fixture(scope="module", params=["inline", "jinja"])
def ernie_dir(request, ernie_spm, tmp_path_factory) -> Path:
    return write_ernie_tokenizer(tmp_path_factory.mktemp(f"ernie_{request.param}"), ernie_spm, request.param)


@pytest.fixture(scope="module")
def ernie_tok(ernie_dir):
    return load_model_tokenizer(ernie_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_ernie_encodes_like_sentencepiece(ernie_tok, sp, text):
    ids = ernie_tok.encode(text, add_special_tokens=False)
    assert ids == sp.encode(text)
    assert ernie_tok.encode(text) == ids, "ERNIE never adds BOS/EOS"
    assert ernie_tok(text)["input_ids"] == ids
    assert ernie_tok.decode(ids) == sp.decode(ids) == text


def test_ernie_special_and_user_defined_pieces(ernie_tok, sp):
    tok = ernie_tok
    for name, piece in [("bos_token", "<s>"), ("eos_token", "</s>"), ("unk_token", "<unk>"),
                        ("cls_token", "<|begin_of_sentence|>"), ("sep_token", "<|end_of_sentence|>"),
                        ("mask_token", "<mask:1>")]:
        assert getattr(tok, name) == piece
        assert getattr(tok, name + "_id") == sp.piece_to_id(piece)
    assert tok.eos_token_id == 2
    for piece in ["<mask:4>", "<mask:7>", "<|begin_of_sentence|>"]:
        assert piece in tok.all_special_tokens
    # sentencepiece's user-defined pieces are one id each, as in ERNIE's tokenizer
    for piece in ["<mask:2>", "<cls>", "<|im_start|>", "<think>", "</think>"]:
        assert tok.encode(f"a{piece}b", add_special_tokens=False) == sp.encode(f"a{piece}b")
        assert len(tok.encode(piece, add_special_tokens=False)) == 1
    assert len(tok) == sp.vocab_size()


def test_ernie_decode_keeps_or_drops_special_tokens(ernie_tok):
    text = "<|begin_of_sentence|>User: 你好 🦙\nAssistant: <think>\nok\n</think>\n\nHi there!<|end_of_sentence|></s>"
    ids = ernie_tok.encode(text, add_special_tokens=False)
    assert ernie_tok.decode(ids, skip_special_tokens=False) == text  # joined verbatim, no spaces added
    assert ernie_tok.decode(ids, skip_special_tokens=True) == \
        "User: 你好 🦙\nAssistant: <think>\nok\n</think>\n\nHi there!"
    assert ernie_tok.decode(ids[-3:], skip_special_tokens=True) == "!"


def test_ernie_streaming_detokenizer_matches_decode(ernie_tok):
    from fastdeploy.output.detokenizer import IncrementalDetokenizer

    prompt = ernie_tok.encode(ERNIE_PROMPT, add_special_tokens=False)
    answer = ernie_tok.encode("你好！emoji 🦙👍🏽 and  spaces.<|end_of_sentence|>", add_special_tokens=False)
    detok = IncrementalDetokenizer(ernie_tok, prompt, skip_special_tokens=True)
    for token_id in answer:
        detok.add_token(token_id)
    assert detok.text == ernie_tok.decode(answer, skip_special_tokens=True) == "你好！emoji 🦙👍🏽 and  spaces."


def test_ernie_chat_template_honours_enable_thinking(ernie_tok):
    def apply(**kwargs):
        return ernie_tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, **kwargs)

    assert apply(enable_thinking=False) == ERNIE_PROMPT + "<think>\n\n</think>\n\n"
    assert apply(enable_thinking=True) == ERNIE_PROMPT + "<think>\n"
    assert apply() == ERNIE_PROMPT + "<think>\n"
    history = MESSAGES + [{"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks"}]
    assert ernie_tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True, enable_thinking=False) \
        == ERNIE_PROMPT + "4<|end_of_sentence|>User: Thanks\nAssistant: <think>\n\n</think>\n\n"


def test_ernie_remote_code_is_never_run(ernie_dir, ernie_tok):
    from transformers import TokenizersBackend

    assert not (ernie_dir / "REMOTE_CODE_RAN").exists()
    assert isinstance(ernie_tok, TokenizersBackend)
    assert "auto_map" not in ernie_tok.init_kwargs
    saved = ernie_dir.parent / (ernie_dir.name + "_saved")
    ernie_tok.save_pretrained(str(saved))
    assert "auto_map" not in json.loads((saved / "tokenizer_config.json").read_text())


def test_ernie_without_declared_class_replaces_the_generic_conversion(ernie_spm, sp, tmp_path):
    """config.json says ernie4_5 and tokenizer_config.json names no class: AutoTokenizer converts generically."""
    path = write_ernie_tokenizer(tmp_path / "plain", ernie_spm)
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["tokenizer_class"], config["auto_map"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    from transformers import AutoTokenizer, TokenizersBackend

    generic = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    assert type(generic) is TokenizersBackend
    assert generic.encode("x<mask:2>y", add_special_tokens=False) != sp.encode("x<mask:2>y")  # spelled out
    tok = load_model_tokenizer(path)
    assert type(tok) is not TokenizersBackend
    assert tok.encode("x<mask:2>y<|im_start|>", add_special_tokens=False) == sp.encode("x<mask:2>y<|im_start|>")
    assert tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=False) \
        .endswith("<think>\n\n</think>\n\n")


def test_other_sentencepiece_file_name_and_no_config_json(ernie_spm, sp, tmp_path, caplog):
    """FastDeploy also reads `spm.model`; AutoTokenizer fails on this directory, the fallback builds it."""
    path = write_ernie_tokenizer(tmp_path / "spm", ernie_spm, config_json=False)
    (path / "tokenizer.model").rename(path / "spm.model")
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["tokenizer_class"], config["auto_map"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    with caplog.at_level("INFO", logger="fastdeploy.model_executor.model_loader.tokenizer_loader"):
        tok = load_model_tokenizer(path)
    assert "AutoTokenizer could not load" in caplog.text
    assert tok.encode(TEXTS[3], add_special_tokens=False) == sp.encode(TEXTS[3])
    assert not (path / "REMOTE_CODE_RAN").exists()


def test_tokenizer_json_with_remote_code_and_unknown_model_type(ernie_tok, ernie_spm, sp, tmp_path, caplog):
    """A `-PT`-style directory (tokenizer.json beside tokenizer.model) whose model type transformers does not
    override (here ERNIE-VL's), so AutoTokenizer refuses the auto_map: tokenizer.json is read without it."""
    path = write_ernie_tokenizer(tmp_path / "vl", ernie_spm, "jinja", config_json=False)
    (path / "config.json").write_text(json.dumps({"model_type": "ernie4_5_moe_vl"}))
    ernie_tok.backend_tokenizer.save(str(path / "tokenizer.json"))
    with caplog.at_level("INFO", logger="fastdeploy.model_executor.model_loader.tokenizer_loader"):
        tok = load_model_tokenizer(path)
    assert "reading its tokenizer.json" in caplog.text
    for text in TEXTS + ["a<mask:2>b<|end_of_sentence|>"]:
        assert tok.encode(text, add_special_tokens=False) == sp.encode(text)
    assert tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, enable_thinking=False) \
        == ERNIE_PROMPT + "<think>\n\n</think>\n\n"
    assert not (path / "REMOTE_CODE_RAN").exists() and "auto_map" not in tok.init_kwargs


def test_added_tokens_past_the_sentencepiece_vocab_keep_their_ids(ernie_spm, sp, tmp_path):
    path = write_ernie_tokenizer(tmp_path / "added", ernie_spm, "jinja")
    config = json.loads((path / "tokenizer_config.json").read_text())
    n = sp.vocab_size()
    config["added_tokens_decoder"][str(n)] = {"content": "<|IMAGE_PLACEHOLDER|>", "special": True, "normalized": False}
    config["added_tokens_decoder"][str(n + 2)] = {"content": "<tool_call>", "special": False, "normalized": False}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_model_tokenizer(path)
    assert tok.convert_tokens_to_ids(["<|IMAGE_PLACEHOLDER|>", "<tool_call>"]) == [n, n + 2]
    ids = tok.encode("a<|IMAGE_PLACEHOLDER|>b<tool_call>c", add_special_tokens=False)
    assert n in ids and n + 2 in ids
    assert tok.decode(ids, skip_special_tokens=True) == "ab<tool_call>c"


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_normalizer_settings_are_followed(model_type, tmp_path):
    """A model with nmt_nfkc, a dummy prefix and whitespace cleanup (not ERNIE's) still encodes like sentencepiece."""
    import sentencepiece as spm

    model = train_sentencepiece(model_type, vocab_size=500, ernie=False)
    oracle = spm.SentencePieceProcessor(model_proto=model)
    path = tmp_path / "nfkc"
    path.mkdir()
    (path / "tokenizer.model").write_bytes(model)
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "SomeRemoteTokenizer",
                                                            "auto_map": {"AutoTokenizer": ["x.Y", None]}}))
    tok = load_model_tokenizer(path)
    for text in TEXTS + ["Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "   leading and trailing   "]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == oracle.encode(text), text
        assert tok.decode(ids) == oracle.decode(ids), text
    # Text is split at added tokens first and each run is encoded on its own (dummy prefix included),
    # as the slow remote tokenizers (ERNIE's among them) do for the tokens they register.
    mask = oracle.piece_to_id("<mask:0>")
    assert tok.encode("a<mask:0>b", add_special_tokens=False) == oracle.encode("a") + [mask] + oracle.encode("b")
    assert tok.encode("x<cls>y", add_special_tokens=False) == \
        oracle.encode("x") + [oracle.piece_to_id("<cls>")] + oracle.encode("y")


# ---- Qwen3 -------------------------------------------------------------------------------------
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


# ---- end to end: a tiny random ERNIE-4.5 with the ERNIE tokenizer files ------------------------
@pytest.fixture(scope="module")
def tiny_ernie_dir(ernie_spm, sp, tmp_path_factory) -> Path:
    import torch
    from transformers import Ernie4_5Config, Ernie4_5ForCausalLM

    torch.manual_seed(0)
    config = Ernie4_5Config(
        vocab_size=sp.vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        use_bias=False, tie_word_embeddings=True, rms_norm_eps=1e-5, initializer_range=0.2,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    path = tmp_path_factory.mktemp("tiny_ernie")
    Ernie4_5ForCausalLM(config).eval().save_pretrained(str(path))
    return write_ernie_tokenizer(path, ernie_spm, "jinja")


def test_tiny_ernie_loads_and_chats_through_llm(tiny_ernie_dir, sp):
    from fastdeploy import LLM, SamplingParams
    from fastdeploy.model_executor.model_loader import hf_loader

    ours = load_model_tokenizer(tiny_ernie_dir)
    assert len(ours) == sp.vocab_size()
    # The engine's loader must already read this directory (it does, before wiring load_model_tokenizer in).
    engine_side = hf_loader.load_hf_tokenizer(tiny_ernie_dir)
    assert engine_side.eos_token_id == ours.eos_token_id == 2

    llm = LLM(model=str(tiny_ernie_dir), max_model_len=256, num_gpu_blocks_override=16)
    outputs = llm.chat(MESSAGES, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                       use_tqdm=False, chat_template_kwargs={"enable_thinking": False})
    out = outputs[0]
    assert out.prompt == ERNIE_PROMPT + "<think>\n\n</think>\n\n"
    assert out.prompt_token_ids == ours.encode(out.prompt, add_special_tokens=False) == sp.encode(out.prompt)
    assert len(out.outputs.token_ids) == 8
    assert all(0 <= t < sp.vocab_size() for t in out.outputs.token_ids)
    assert out.outputs.text == ours.decode(out.outputs.token_ids, skip_special_tokens=True)
    assert not (tiny_ernie_dir / "REMOTE_CODE_RAN").exists()


def test_engine_tokenizer_keeps_user_defined_pieces(tiny_ernie_dir, sp):
    from fastdeploy.model_executor.model_loader import hf_loader

    engine_side = hf_loader.load_hf_tokenizer(tiny_ernie_dir)
    assert engine_side.encode("a<mask:2>b<|im_start|>", add_special_tokens=False) == sp.encode("a<mask:2>b<|im_start|>")
