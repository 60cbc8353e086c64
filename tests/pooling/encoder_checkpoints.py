"""Tiny random encoder checkpoints (BERT: bge / e5 / all-MiniLM's architecture; XLM-RoBERTa: bge-m3's and the
bge-reranker cross-encoders') written by transformers, with locally built tokenizers (a WordPiece vocabulary
with [CLS]/[SEP]; a BPE with XLM-R's <s> A </s></s> B </s> template), as plain HF directories or as
sentence-transformers models."""
import json
from pathlib import Path

from tiny_models import randomize_biases_and_norms

WORDS = ("the quick brown fox jumps over lazy dog hello world machine learning is fascinating how are you "
         "what capital of china paris france query passage search retrieve relevant a an and or not").split()
MAX_POSITIONS = 512


def write_bert_tokenizer(path: Path) -> None:
    from transformers import BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] \
        + list("abcdefghijklmnopqrstuvwxyz0123456789.,!?")
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(str(path / "vocab.txt")).save_pretrained(str(path))


def write_xlmr_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainers.BpeTrainer(vocab_size=200, special_tokens=specials,
                                                                        show_progress=False))
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", bos), ("</s>", eos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", cls_token="<s>",
                                   sep_token="</s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
    fast.save_pretrained(str(path))


def make_encoder(path: Path, family: str, num_labels: int = 0, seed: int = 0, dtype: str = "float32"):
    """A tiny random `family` ("bert" or "xlmr") encoder at `path`: the base model, or with num_labels the
    *ForSequenceClassification; 512 positions as the released models. Returns the transformers model."""
    import torch
    import transformers

    torch.manual_seed(seed)
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  initializer_range=0.2)
    if family == "bert":
        write_bert_tokenizer(path)
        vocab = len((path / "vocab.txt").read_text().split())
        config = transformers.BertConfig(vocab_size=vocab, max_position_embeddings=MAX_POSITIONS, type_vocab_size=2,
                                         **common)
        name = "Bert"
    else:
        write_xlmr_tokenizer(path)
        vocab = json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]
        config = transformers.XLMRobertaConfig(vocab_size=len(vocab), max_position_embeddings=MAX_POSITIONS + 2,
                                               type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                               **common)
        name = "XLMRoberta"
    if num_labels:
        config.num_labels = num_labels
        model = getattr(transformers, f"{name}ForSequenceClassification")(config)
    else:
        model = getattr(transformers, f"{name}Model")(config, add_pooling_layer=False)
    model = model.eval()
    randomize_biases_and_norms(model, seed)  # biases and LayerNorms away from 0 / 1, so the tests see them
    (model.to(torch.bfloat16) if dtype == "bfloat16" else model).save_pretrained(str(path))
    return model.float()


def make_sentence_encoder(root: Path, family: str, pooling_mode: str = "cls"):
    """A sentence-transformers embedding model (Transformer on a tiny `family` encoder, Pooling, Normalize) at
    root/"st"; returns (path, SentenceTransformer)."""
    from pooling_checkpoints import sentence_transformer_dir

    make_encoder(root / "hf", family)
    st = sentence_transformer_dir(root / "hf", root / "st", pooling_mode, max_seq_length=MAX_POSITIONS)
    return root / "st", st
