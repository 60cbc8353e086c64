"""Tiny random pooling checkpoints written by transformers and sentence-transformers (the oracles):
decoder embedders (a Qwen3-Embedding-like sentence-transformers model: last-token pooling, Normalize, a
tokenizer that appends EOS), decoder classifiers (`*ForSequenceClassification`) and a Qwen3-Reranker-like
causal LM. The encoders (BERT, XLM-RoBERTa) are in encoder_checkpoints.py."""
import json
from pathlib import Path

from tiny_llama import write_tokenizer
from tiny_models import COMMON, TINY_MODELS, make_tiny_model, randomize_biases_and_norms

EOS = "<|endoftext|>"


def append_eos(path: Path) -> None:
    """Give the tokenizer at `path` a post-processor appending <|endoftext|> to every text (as
    Qwen3-Embedding's tokenizer.json does), so special-token encoding ends each input with it."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    eos_id = tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", pair=f"$A {EOS} $B:1 {EOS}:1",
                                                       special_tokens=[(EOS, eos_id)])
    tok.save(str(path / "tokenizer.json"))


def drop_chat_template(path: Path) -> None:
    """Remove the tokenizer's chat template: sentence-transformers 6 renders plain strings through a chat
    template when the tokenizer has one, which an embedding pipeline of plain texts must not get."""
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))


def sentence_transformer_dir(model_dir: Path, out: Path, pooling_mode: str, normalize: bool = True,
                             legacy_layout: bool = False, max_seq_length: int = 256):
    """Save a sentence-transformers model (Transformer on `model_dir`, Pooling `pooling_mode`, [Normalize]) at
    `out`; legacy_layout rewrites modules.json and the pooling config in the hub's older form
    (`sentence_transformers.models.*` types, pooling_mode_* flags). Returns the SentenceTransformer."""
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(str(model_dir), max_seq_length=max_seq_length)
    hidden = transformer.get_word_embedding_dimension()
    modules = [transformer, models.Pooling(hidden, pooling_mode=pooling_mode)]
    if normalize:
        modules.append(models.Normalize())
    st = SentenceTransformer(modules=modules, device="cpu")
    st.save(str(out))
    if legacy_layout:
        write_legacy_layout(out, pooling_mode)
    return st


def write_legacy_layout(out: Path, pooling_mode: str) -> None:
    entries = json.loads((out / "modules.json").read_text())
    for entry in entries:
        entry["type"] = "sentence_transformers.models." + entry["type"].rsplit(".", 1)[-1]
        if entry["type"].endswith("Pooling"):
            config_path = out / entry["path"] / "config.json"
            config = json.loads(config_path.read_text())
            flags = {"cls": "cls_token", "mean": "mean_tokens", "lasttoken": "lasttoken"}
            legacy = {"word_embedding_dimension": config.get("embedding_dimension")}
            for mode in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens",
                         "lasttoken"):
                legacy[f"pooling_mode_{mode}"] = mode == flags[pooling_mode]
            config_path.write_text(json.dumps(legacy))
    (out / "modules.json").write_text(json.dumps(entries))


def make_qwen3_embedding(root: Path, legacy_layout: bool = False, pooling_mode: str = "lasttoken",
                         matryoshka: bool = False):
    """A Qwen3-Embedding-like sentence-transformers model at root/"st" (its Transformer reads root/"hf": a
    tiny random Qwen3 whose tokenizer appends EOS). Returns (path, SentenceTransformer)."""
    hf = root / "hf"
    make_tiny_model(hf, "qwen3")
    append_eos(hf)
    drop_chat_template(hf)
    if matryoshka:
        config = json.loads((hf / "config.json").read_text())
        config["matryoshka_dimensions"] = [16, 32, 64]
        (hf / "config.json").write_text(json.dumps(config))
    st = sentence_transformer_dir(hf, root / "st", pooling_mode, legacy_layout=legacy_layout)
    return root / "st", st


def make_decoder_classifier(path: Path, family: str = "qwen3", num_labels: int = 3, seed: int = 0):
    """A tiny random `{Qwen2,Qwen3,Llama}ForSequenceClassification` at `path`; returns it (float32, eval)."""
    import torch
    import transformers

    name = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama"}[family]
    overrides = dict(TINY_MODELS[family][1]) if family in TINY_MODELS else {}
    overrides.pop("tie_word_embeddings", None)
    config = getattr(transformers, f"{name}Config")(**COMMON, **overrides, num_labels=num_labels)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{name}ForSequenceClassification")(config).eval()
    randomize_biases_and_norms(model, seed)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    write_tokenizer(path)
    return model
