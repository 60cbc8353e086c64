"""Model directories for the tokenizer tests of this folder, built here to mimic the real ones, and the
texts and chat messages the tests encode.

ERNIE-4.5: a sentencepiece BPE `tokenizer.model` trained on English + Chinese with ERNIE's settings as
transformers' port converted them (no dummy prefix, spaces kept, byte fallback) and ERNIE's special
pieces; a tokenizer_config.json shaped like Baidu's (class `Ernie4_5_Tokenizer` / `Ernie4_5Tokenizer`
with an `auto_map` to a remote `tokenization_ernie4_5.py` that must never run, cls
`<|begin_of_sentence|>`, sep `<|end_of_sentence|>`, mask and the `sys_*` / `header_*` tokens); an
ERNIE-style chat template (inline or chat_template.jinja) that honours `enable_thinking`. The oracle
is sentencepiece itself on the same model file. The ERNIE fixtures are in conftest.py; the Qwen3
directory is built in test_qwen_tokenizer.py.
"""
import io
import json
from pathlib import Path

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

