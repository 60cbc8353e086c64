"""The encoder models (models/bert.py, models/xlm_roberta.py) against transformers.

Oracle: transformers 5 (torch CPU, float32) on tiny random checkpoints it wrote itself (2 layers, hidden
64, 4 heads for BERT, 2 for XLM-R; biases and LayerNorms randomised, since transformers initialises them to
0 and 1), each loaded into our model through the engine's loader path (hf_loader.open_hf_dir ->
ModelConfig.from_hf_config -> registry -> load_weights). One ragged batch of sequences of different lengths
(BERT: sentence pairs with token type ids) in one forward must give, row for row, transformers' last hidden
states of each sequence alone within 1e-4 (max abs), with the compiled `vision_attention` op and with the
fallbacks forced; the classification logits of the [CLS] / <s> rows must match *ForSequenceClassification's
within 1e-4. bf16 and wint8 (packed linears) must keep cosine >= 0.999 per row against float32
transformers. Then loading: names with and without the base prefix, the ignored heads and buffers, and the
errors (unknown, misshapen, missing tensor; too long a max_model_len).
"""
from pathlib import Path

import numpy as np
import paddle
import pytest
import torch

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.quantization.packed import BF16, WINT8, PackedConfig, PackedLinearMethod
from fastdeploy.model_executor.model_loader.hf_loader import open_hf_dir
from fastdeploy.model_executor.models import MODEL_REGISTRY, get_model_class
from fastdeploy.model_executor.ops import compiled_op, fallbacks_forced

from tiny_models import randomize_biases_and_norms

VOCAB = 120
LENGTHS = [1, 6, 17, 40, 3]  # one step's sequences, back to back
MAX_MODEL_LEN = 64
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              initializer_range=0.2, layer_norm_eps=1e-5)
# name -> (architecture, config class, config overrides)
CHECKPOINTS = {
    "bert": ("BertModel", "BertConfig", dict(max_position_embeddings=MAX_MODEL_LEN, type_vocab_size=2)),
    "bert_cls": ("BertForSequenceClassification", "BertConfig",
                 dict(max_position_embeddings=MAX_MODEL_LEN, type_vocab_size=2, num_labels=3)),
    # pad_token_id 1 as the released models: positions start at 2, so the table has 2 more rows; head_dim 32
    "xlmr": ("XLMRobertaModel", "XLMRobertaConfig",
             dict(max_position_embeddings=MAX_MODEL_LEN + 2, type_vocab_size=1, pad_token_id=1, num_attention_heads=2)),
    "xlmr_cls": ("XLMRobertaForSequenceClassification", "XLMRobertaConfig",
                 dict(max_position_embeddings=MAX_MODEL_LEN + 2, type_vocab_size=1, pad_token_id=1,
                      num_attention_heads=2, num_labels=1)),
}
BASE_PREFIX = {"bert": "bert.", "xlmr": "roberta."}


def make_checkpoint(path: Path, name: str):
    """Save the random tiny transformers model `name` at `path`; returns it (float32, eval)."""
    import transformers

    architecture, config_cls, overrides = CHECKPOINTS[name]
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(getattr(transformers, config_cls)(**{**COMMON, **overrides})).eval()
    randomize_biases_and_norms(model, seed=1)
    model.save_pretrained(str(path))
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """checkpoint(name) -> (directory, transformers model), written once per module."""
    built = {}

    def get(name: str):
        if name not in built:
            path = tmp_path_factory.mktemp(name)
            built[name] = (path, make_checkpoint(path, name))
        return built[name]

    return get


def load_ours(path: Path, quant_config=None, weights=None, max_model_len: int = MAX_MODEL_LEN):
    """Our model built and loaded as the engine does; `weights` replaces the checkpoint's stream when given."""
    source = open_hf_dir(path)
    config = ModelConfig.from_hf_config(source.hf_config)
    model = get_model_class(config.architecture)(config, 16, max_model_len, quant_config)
    model.load_weights(source.weights() if weights is None else weights)
    return model


def batch(pairs: bool):
    """(sequences of token ids, their token type ids or None): BERT pairs put the second half in segment 1."""
    rng = np.random.default_rng(0)
    seqs = [rng.integers(2, VOCAB, size=n) for n in LENGTHS]  # never the pad id (1), as a tokenizer's text
    types = [(np.arange(n) >= (n + 1) // 2).astype(np.int64) for n in LENGTHS] if pairs else None
    return seqs, types


def forward_meta(seqs, types) -> ForwardMeta:
    """An encoder step's metadata: the sequences' boundaries and segment ids; no KV cache (no caches, no blocks)."""
    lengths = np.asarray([len(s) for s in seqs], np.int64)
    return ForwardMeta(seq_lens_this_time=lengths, seq_lens_decoder=np.zeros_like(lengths),
                       cu_seqlens_q=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                       block_tables=np.zeros((len(seqs), 0), np.int64), slot_mapping=np.zeros(0, np.int64), caches=[],
                       token_type_ids=None if types is None else paddle.to_tensor(np.concatenate(types)))


def our_hidden(model, seqs, types) -> np.ndarray:
    """One forward over the ragged batch -> [sum(LENGTHS), hidden]."""
    positions = np.concatenate([np.arange(len(s)) for s in seqs])
    with paddle.no_grad():
        ids = paddle.to_tensor(np.concatenate(seqs))
        return model(ids, paddle.to_tensor(positions), forward_meta(seqs, types)).numpy()


def hf_hidden(hf, seqs, types) -> np.ndarray:
    """transformers' last hidden states of each sequence alone, concatenated."""
    base = getattr(hf, "bert", None) or getattr(hf, "roberta", None) or hf
    out = []
    with torch.no_grad():
        for i, s in enumerate(seqs):
            tt = None if types is None else torch.tensor(types[i])[None]
            out.append(base(torch.tensor(s)[None], token_type_ids=tt).last_hidden_state[0].numpy())
    return np.concatenate(out)


def hf_logits(hf, seqs, types) -> np.ndarray:
    with torch.no_grad():
        return np.concatenate([hf(torch.tensor(s)[None], token_type_ids=None if types is None
                                  else torch.tensor(types[i])[None]).logits.numpy() for i, s in enumerate(seqs)])


def first_rows(hidden: np.ndarray) -> paddle.Tensor:
    """Each sequence's first ([CLS] / <s>) row, as the pooler picks them."""
    return paddle.to_tensor(hidden[np.concatenate([[0], np.cumsum(LENGTHS)[:-1]])])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_hidden_states_match_transformers_with_op_and_fallback(checkpoint, name, ops_enabled):
    path, hf = checkpoint(name)
    seqs, types = batch(pairs=name.startswith("bert"))
    model = load_ours(path)
    assert type(model).__name__ == CHECKPOINTS[name][0]
    assert compiled_op("vision_attention") is not None
    ref = hf_hidden(hf, seqs, types)
    compiled = our_hidden(model, seqs, types)
    with fallbacks_forced():
        fallback = our_hidden(model, seqs, types)
    assert compiled.shape == ref.shape == (sum(LENGTHS), 64)
    assert np.abs(compiled - ref).max() <= 1e-4
    assert np.abs(fallback - ref).max() <= 1e-4
    assert np.abs(compiled - fallback).max() <= 1e-5
    if types is not None:  # the segment ids are used: without them the pairs' second halves differ
        assert np.abs(our_hidden(model, seqs, None) - ref).max() > 1e-2


def test_inputs_embeds_stand_for_input_ids(checkpoint):
    path, _ = checkpoint("bert")
    seqs, types = batch(pairs=True)
    model = load_ours(path)
    ids = np.concatenate(seqs)
    meta_hidden = our_hidden(model, seqs, types)
    with paddle.no_grad():
        embeds = model.embeddings.word_embeddings(paddle.to_tensor(ids))  # [n, hidden]
        positions = paddle.to_tensor(np.concatenate([np.arange(len(s)) for s in seqs]))
        via_embeds = model(None, positions, forward_meta(seqs, types), inputs_embeds=embeds).numpy()
    assert np.array_equal(via_embeds, meta_hidden)


@pytest.mark.parametrize("name", ["bert_cls", "xlmr_cls"])
def test_classification_logits_match_transformers(checkpoint, name):
    path, hf = checkpoint(name)
    seqs, types = batch(pairs=name.startswith("bert"))
    model = load_ours(path)
    assert model.num_labels == hf.config.num_labels == CHECKPOINTS[name][2]["num_labels"]
    with paddle.no_grad():
        logits = model.classify(first_rows(our_hidden(model, seqs, types))).numpy()
    ref = hf_logits(hf, seqs, types)
    assert logits.shape == ref.shape == (len(LENGTHS), model.num_labels) and logits.dtype == np.float32
    assert np.abs(logits - ref).max() <= 1e-4
    assert np.ptp(ref, axis=0).max() > 1e-2  # the sequences' logits differ: the comparison can fail


@pytest.mark.parametrize("kind", [BF16, WINT8])
@pytest.mark.parametrize("name", ["bert", "xlmr"])
def test_packed_linears_stay_close_to_float32_transformers(checkpoint, name, kind, ops_enabled):
    path, hf = checkpoint(name)
    seqs, types = batch(pairs=name == "bert")
    model = load_ours(path, PackedConfig(kind))
    qkv = model.encoder.layer[0].attention.self.qkv_proj
    assert isinstance(qkv.method, PackedLinearMethod) and qkv.method.packed and qkv.method.kind == kind
    ours, ref = our_hidden(model, seqs, types), hf_hidden(hf, seqs, types)
    assert cosines(ours, ref).min() >= 0.999
    assert np.abs(ours - ref).max() > 1e-5  # the packed path ran, not float32


@pytest.mark.parametrize("name", ["bert", "xlmr_cls"])
def test_names_with_or_without_the_base_prefix_load_alike(checkpoint, name):
    """A plain-model checkpoint renamed with the base prefix (and the other way round), LayerNorm gamma/beta
    spellings, an MLM head and torch buffers: the same hidden states."""
    path, _ = checkpoint(name)
    seqs, types = batch(pairs=False)
    prefix = BASE_PREFIX[name.split("_")[0]]

    def renamed():
        for n, a in open_hf_dir(path).weights():
            if n.startswith(prefix):
                n = n[len(prefix):]
            elif not n.startswith("classifier."):
                n = prefix + n
            if n.endswith("LayerNorm.weight"):
                n = n[: -len("weight")] + "gamma"
            yield n, a
        yield "cls.predictions.bias", np.zeros(VOCAB, np.float32)
        yield "lm_head.dense.weight", np.zeros((64, 64), np.float32)
        yield prefix + "embeddings.position_ids", np.arange(MAX_MODEL_LEN, dtype=np.float32)[None]
        yield "pooler.dense.weight", np.zeros((63, 2), np.float32)  # ignored whatever its shape

    expected = our_hidden(load_ours(path), seqs, types)
    assert np.array_equal(our_hidden(load_ours(path, weights=renamed()), seqs, types), expected)


def test_bert_classifier_needs_its_pooler(checkpoint):
    path, _ = checkpoint("bert_cls")
    weights = (w for w in open_hf_dir(path).weights() if not w[0].startswith("bert.pooler.dense.weight"))
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*pooler\.dense\.weight"):
        load_ours(path, weights=weights)


@pytest.mark.parametrize("bad, message", [
    ("unknown", r"'bert\.encoder\.layer\.0\.attention\.self\.bogus\.weight' is not a parameter of BertModel"),
    ("misshapen", r"'encoder\.layer\.1\.attention\.self\.key\.weight' has shape \[64, 63\], expected \[64, 64\]"),
    ("missing", r"lacks 1 tensor.*'encoder\.layer\.1\.attention\.self\.value\.bias'"),
    ("classifier", r"'classifier\.weight' is not a parameter of BertModel"),
])
def test_bad_weights_are_refused_naming_the_tensor(checkpoint, bad, message):
    path, _ = checkpoint("bert")

    def weights():
        for n, a in open_hf_dir(path).weights():
            if bad == "misshapen" and n == "encoder.layer.1.attention.self.key.weight":
                a = a[:, :63]
            if not (bad == "missing" and n == "encoder.layer.1.attention.self.value.bias"):
                yield n, a
        if bad == "unknown":
            yield "bert.encoder.layer.0.attention.self.bogus.weight", np.zeros((64, 64), np.float32)
        if bad == "classifier":
            yield "classifier.weight", np.zeros((2, 64), np.float32)

    with pytest.raises(ValueError, match=message):
        load_ours(path, weights=weights())


@pytest.mark.parametrize("name, limit", [("bert", MAX_MODEL_LEN), ("xlmr", MAX_MODEL_LEN)])
def test_max_model_len_past_the_position_table_is_refused(checkpoint, name, limit):
    path, _ = checkpoint(name)
    config = ModelConfig.from_hf_config(open_hf_dir(path).hf_config)
    cls = get_model_class(config.architecture)
    assert config.max_sequence_length == limit
    with pytest.raises(ValueError, match=rf"max_model_len {limit + 1} exceeds the {limit} positions"):
        cls(config, 16, limit + 1)


def test_registry_names_the_encoders():
    for arch in ("BertModel", "BertForSequenceClassification", "XLMRobertaModel",
                 "XLMRobertaForSequenceClassification", "RobertaModel", "RobertaForSequenceClassification"):
        assert ModelConfig.from_hf_config(dict(COMMON, architectures=[arch])).encoder_only
    assert not ModelConfig.from_hf_config(dict(COMMON, architectures=["Qwen3ForCausalLM"])).encoder_only
