"""BERT (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers"), encoder only:
`BertModel` (the last hidden state of every token: bge, e5, all-MiniLM embedders) and
`BertForSequenceClassification` (a cross-encoder's logits from the [CLS] row).

Computation (transformers' modeling_bert, in eval mode: dropout off):

  embeddings = LayerNorm(word[input_ids] + position[positions + offset] + token_type[token_type_ids])
  per layer (post-norm):
    a = LayerNorm(attention.output.dense(attention(qkv_proj(x))) + x)
    x = LayerNorm(output.dense(act(intermediate.dense(a))) + a)
  classify: classifier(tanh(pooler.dense(cls_row)))

Attention is bidirectional within each sequence of the step's ragged batch (the compiled
`vision_attention` op, ops/vision_attention.py, or its Paddle reference), softmax(q k^T / sqrt(head_dim)) v.
`offset` is 0 for BERT; XLM-RoBERTa (models/xlm_roberta.py), which shares this tree, uses
pad_token_id + 1. act is config.json's `hidden_act` (HIDDEN_ACTS). The query/key/value/attention-output/
intermediate/output linears take the engine's weight format (layers/linear.py `select_linear_method`:
float32, or packed bf16 / wint8 / wint4); embeddings, LayerNorms and the classification head, which runs on
one row per sequence, stay float32.

Parameters are named as the checkpoint's tensors without the base prefix ("bert." / "roberta."), the
query/key/value of each layer packed into `attention.self.qkv_proj` (shards "q", "k", "v"). The runner-facing
contract is in models/__init__.py (encoder models: no KV cache, config.py ENCODER_ARCHITECTURES).
"""
from typing import Iterable, Optional

import paddle
import paddle.nn.functional as F

from fastdeploy.config import ModelConfig
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.embeddings import VocabEmbedding
from fastdeploy.model_executor.layers.linear import Linear, QuantConfig, UnquantizedLinearMethod, select_linear_method
from fastdeploy.model_executor.layers.normalization import LayerNorm
from fastdeploy.model_executor.ops.vision_attention import vision_attention

# config.json `hidden_act` -> the function after the intermediate linear (transformers' ACT2FN)
HIDDEN_ACTS = {
    "gelu": lambda x: F.gelu(x, approximate=False),  # erf GELU
    "gelu_new": lambda x: F.gelu(x, approximate=True),  # tanh approximation
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate=True),
    "relu": F.relu,
}
QKV_SHARDS = {"query": "q", "key": "k", "value": "v"}  # checkpoint module -> shard of attention.self.qkv_proj
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")  # torch buffers some checkpoints carry
LAYER_NORM_ALIASES = {"gamma": "weight", "beta": "bias"}  # the original TF-converted checkpoints' names


def dense(in_features: int, out_features: int) -> Linear:
    """A float32 Linear with bias (the classification heads': one row per sequence, so never packed)."""
    return Linear(in_features, {None: out_features}, True, UnquantizedLinearMethod())


class BertEmbeddings(paddle.nn.Layer):
    """word_embeddings [vocab, hidden], position_embeddings [max_position_embeddings, hidden],
    token_type_embeddings [type_vocab_size, hidden], LayerNorm; `position_offset` is added to positions."""

    def __init__(self, config: ModelConfig, position_offset: int):
        super().__init__()
        hf = config.hf_config
        self.position_offset = position_offset
        self.word_embeddings = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = VocabEmbedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = VocabEmbedding(hf.get("type_vocab_size", 2), config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, hf.get("layer_norm_eps", 1e-12))

    def forward(self, input_ids: Optional[paddle.Tensor], positions: paddle.Tensor,
                token_type_ids: Optional[paddle.Tensor], inputs_embeds: Optional[paddle.Tensor]) -> paddle.Tensor:
        """input_ids [n] int64 (or inputs_embeds [n, hidden] float32), positions [n] int64 (0-based within each
        sequence), token_type_ids [n] int64 or None (all 0) -> [n, hidden] float32. An index past its table
        raises Paddle's ValueError."""
        x = inputs_embeds if inputs_embeds is not None else self.word_embeddings(input_ids)  # [n, hidden]
        ids = positions + self.position_offset if self.position_offset else positions  # [n]
        x = x + self.position_embeddings(ids)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]  # [hidden], broadcast over the rows
        else:
            x = x + self.token_type_embeddings(token_type_ids)  # [n, hidden]
        return self.LayerNorm(x)


class BertSelfAttention(paddle.nn.Layer):
    """qkv_proj [hidden -> 3 hidden] (query | key | value, each heads x head_dim) and bidirectional
    attention within each sequence."""

    def __init__(self, config: ModelConfig, quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.scale = (hidden // self.num_heads) ** -0.5
        names = [f"{prefix}.{module}.weight" for module in QKV_SHARDS]
        self.qkv_proj = Linear(hidden, {"q": hidden, "k": hidden, "v": hidden}, True,
                               select_linear_method(quant_config, names))

    def forward(self, x: paddle.Tensor, cu_seqlens: paddle.Tensor) -> paddle.Tensor:
        # x: [n, hidden]; cu_seqlens: [bs + 1] int64 -> [n, hidden] (heads concatenated)
        return vision_attention(self.qkv_proj(x), cu_seqlens, self.num_heads, self.scale)


class BertOutput(paddle.nn.Layer):
    """LayerNorm(dense(x) + residual): the attention's output block and the layer's output block."""

    def __init__(self, in_features: int, config: ModelConfig, quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        self.dense = Linear(in_features, {None: config.hidden_size}, True,
                            select_linear_method(quant_config, [f"{prefix}.dense.weight"]))
        self.LayerNorm = LayerNorm(config.hidden_size, config.hf_config.get("layer_norm_eps", 1e-12))

    def forward(self, x: paddle.Tensor, residual: paddle.Tensor) -> paddle.Tensor:
        return self.LayerNorm(self.dense(x) + residual)  # [n, in] -> [n, hidden]


class BertAttention(paddle.nn.Layer):
    def __init__(self, config: ModelConfig, quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        self.self = BertSelfAttention(config, quant_config, f"{prefix}.self")  # transformers' name
        self.output = BertOutput(config.hidden_size, config, quant_config, f"{prefix}.output")

    def forward(self, x: paddle.Tensor, cu_seqlens: paddle.Tensor) -> paddle.Tensor:
        return self.output(self.self(x, cu_seqlens), x)  # [n, hidden]


class BertIntermediate(paddle.nn.Layer):
    def __init__(self, config: ModelConfig, quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        act = config.hf_config.get("hidden_act", "gelu")
        if act not in HIDDEN_ACTS:
            raise ValueError(f"config.json hidden_act {act!r} is not supported; supported: {sorted(HIDDEN_ACTS)}")
        self.act = HIDDEN_ACTS[act]
        self.dense = Linear(config.hidden_size, {None: config.intermediate_size}, True,
                            select_linear_method(quant_config, [f"{prefix}.dense.weight"]))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.act(self.dense(x))  # [n, hidden] -> [n, intermediate]


class BertLayer(paddle.nn.Layer):
    def __init__(self, config: ModelConfig, quant_config: Optional[QuantConfig], prefix: str):
        super().__init__()
        self.attention = BertAttention(config, quant_config, f"{prefix}.attention")
        self.intermediate = BertIntermediate(config, quant_config, f"{prefix}.intermediate")
        self.output = BertOutput(config.intermediate_size, config, quant_config, f"{prefix}.output")

    def forward(self, x: paddle.Tensor, cu_seqlens: paddle.Tensor) -> paddle.Tensor:
        a = self.attention(x, cu_seqlens)  # [n, hidden]
        return self.output(self.intermediate(a), a)  # [n, hidden]


class BertEncoder(paddle.nn.Layer):
    def __init__(self, config: ModelConfig, quant_config: Optional[QuantConfig]):
        super().__init__()
        self.layer = paddle.nn.LayerList([BertLayer(config, quant_config, f"encoder.layer.{i}")
                                          for i in range(config.num_hidden_layers)])

    def forward(self, x: paddle.Tensor, cu_seqlens: paddle.Tensor) -> paddle.Tensor:
        for layer in self.layer:
            x = layer(x, cu_seqlens)
        return x


class BertModel(paddle.nn.Layer):
    """The encoder: `embeddings`, `encoder.layer[i]`; forward gives the last hidden state of every token.

    Build: `BertModel(model_config, block_size, max_model_len, quant_config=None)` (block_size unused: no
    KV cache). ValueError when max_model_len exceeds `model_config.max_sequence_length` or config.json's
    hidden_act is not in HIDDEN_ACTS. Reads `type_vocab_size` (2), `layer_norm_eps` (1e-12), `hidden_act`
    ("gelu") and `pad_token_id` from `model_config.hf_config` (transformers' defaults in brackets).
    """

    PREFIX = "bert"  # the base model's name in *For* checkpoints; plain-model checkpoints have none
    IGNORED = ("pooler.", "cls.", "lm_head.")  # base-relative names of heads this class does not run

    def __init__(self, config: ModelConfig, block_size: int, max_model_len: int,
                 quant_config: Optional[QuantConfig] = None):
        super().__init__()
        limit = config.max_sequence_length
        if max_model_len > limit:
            raise ValueError(f"max_model_len {max_model_len} exceeds the {limit} positions of {config.architecture} "
                             f"(max_position_embeddings {config.max_position_embeddings}); "
                             f"pass max_model_len <= {limit}")
        self.config = config
        self.embeddings = BertEmbeddings(config, config.position_offset)
        self.encoder = BertEncoder(config, quant_config)

    def forward(self, input_ids: Optional[paddle.Tensor], positions: paddle.Tensor, forward_meta: ForwardMeta,
                inputs_embeds: Optional[paddle.Tensor] = None) -> paddle.Tensor:
        """input_ids [n] int64 (or inputs_embeds [n, hidden] float32), positions [n] int64 (0-based within each
        sequence) of the step's sequences back to back (forward_meta.cu_seqlens_q [bs + 1]; segment ids
        forward_meta.token_type_ids [n] int64 or None for all 0) -> last hidden states [n, hidden] float32.
        forward_meta's caches and block tables are not read."""
        cu_seqlens = as_paddle(forward_meta.cu_seqlens_q)  # [bs + 1] int64, shares the numpy array
        x = self.embeddings(input_ids, positions, forward_meta.token_type_ids, inputs_embeds)  # [n, hidden]
        return self.encoder(x, cu_seqlens)

    # ---- weight loading -------------------------------------------------------------------
    def parameter_of(self, name: str) -> Optional[tuple[str, object]]:
        """(parameter name, shard id) that checkpoint tensor `name` fills, or None for one ignored on purpose
        (heads this class does not run, torch buffers)."""
        base = name[len(self.PREFIX) + 1:] if name.startswith(self.PREFIX + ".") else name
        if base.startswith(self.IGNORED) or base in BUFFERS:
            return None
        head, _, attr = base.rpartition(".")
        if head.endswith("LayerNorm"):
            attr = LAYER_NORM_ALIASES.get(attr, attr)
        module_path, _, module = head.rpartition(".")
        if module in QKV_SHARDS:
            return f"{module_path}.qkv_proj.{attr}", QKV_SHARDS[module]
        return f"{head}.{attr}", None

    def load_weights(self, weights: Iterable[tuple[str, object]]) -> None:
        """Fill every parameter from (checkpoint name, float32 array or QuantizedTensor, HF [out, in] layout)
        pairs, names with or without the "bert." / "roberta." prefix. Raises ValueError naming the tensor for
        an unknown name or a wrong shape, and (at the end) the tensors that never came."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            target = self.parameter_of(name)
            if target is None:
                continue
            param_name, shard = target
            if param_name not in params:
                raise ValueError(f"checkpoint tensor {name!r} is not a parameter of {self.config.architecture}")
            param = params[param_name]
            try:
                param.weight_loader(param, tensor, shard)
            except ValueError as e:
                raise ValueError(f"checkpoint tensor {name!r} {e}") from None
            loaded.add(target)
        missing = [checkpoint_name(p, s) for p, s in self.expected_targets() if (p, s) not in loaded]
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensor(s) of the model, e.g. {missing[:5]}")

    def expected_targets(self) -> list[tuple[str, object]]:
        """(parameter name, shard id) of every checkpoint tensor the model needs, in parameter order."""
        return [(name, shard) for name, _ in self.named_parameters()
                for shard in (QKV_SHARDS.values() if ".qkv_proj." in name else (None,))]


def checkpoint_name(param_name: str, shard) -> str:
    """The (base-relative) checkpoint name of a parameter's shard: the inverse of BertModel.parameter_of."""
    if shard is None:
        return param_name
    module = {s: m for m, s in QKV_SHARDS.items()}[shard]
    return param_name.replace(".qkv_proj.", f".{module}.")


class BertPooler(paddle.nn.Layer):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = dense(hidden_size, hidden_size)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return paddle.tanh(self.dense(x))  # [m, hidden] -> [m, hidden]


class BertForSequenceClassification(BertModel):
    """BertModel plus `pooler.dense` and `classifier` [hidden -> num_labels]; `classify` gives the logits."""

    IGNORED = ("cls.", "lm_head.")

    def __init__(self, config: ModelConfig, block_size: int, max_model_len: int,
                 quant_config: Optional[QuantConfig] = None):
        super().__init__(config, block_size, max_model_len, quant_config)
        self.num_labels = config.num_labels
        self.pooler = BertPooler(config.hidden_size)
        self.classifier = dense(config.hidden_size, self.num_labels)

    def classify(self, pooled: paddle.Tensor) -> paddle.Tensor:
        """pooled [m, hidden] float32 (each sequence's [CLS] row of forward's output) -> logits [m, num_labels]
        float32: classifier(tanh(pooler.dense(pooled))), transformers' BertForSequenceClassification."""
        return self.classifier(self.pooler(pooled))
