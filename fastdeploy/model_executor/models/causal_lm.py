"""A decoder-only causal LM as a paddle.nn.Layer tree: embedding -> decoder layers -> RMSNorm, and lm_head.

The runner-facing contract is in models/__init__.py. Model files subclass `CausalLM` with what is
particular to them: the MLP of each layer (`make_mlp`), the RoPE (`make_rope`), the config flags they imply
(`adapt_config`), and any reordering of checkpoint tensors (`transform_weight`).
"""
import dataclasses
from typing import Iterable, Optional

import paddle

from fastdeploy.config import ModelConfig
from fastdeploy.distributed.parallel_state import get_pp_stage, get_tp_group
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.append_attention import select_attention_backend
from fastdeploy.model_executor.layers.decoder_layer import DecoderLayer
from fastdeploy.model_executor.layers.embeddings import TiedEmbedding, make_embedding, reads_rows
from fastdeploy.model_executor.layers.fused_decoder_layers import plan_layer_runs
from fastdeploy.model_executor.layers.linear import Linear, QuantConfig, select_linear_method
from fastdeploy.model_executor.layers.mlp import DenseMLP
from fastdeploy.model_executor.layers.normalization import RMSNorm
from fastdeploy.model_executor.layers.parameters import release_parameters
from fastdeploy.model_executor.layers.parallel import VocabParallelEmbedding, gather_logits, local_vocab_size
from fastdeploy.model_executor.layers.rotary_embedding import RotaryEmbedding
from fastdeploy.model_executor.model_loader.packed_modules import checkpoint_names_of, parameter_of


class DecoderModel(paddle.nn.Layer):
    """The checkpoint's `model.`: embed_tokens, layers, norm; returns normalised hidden states.

    Chooses at build the attention backend (shared by all layers) and which layers run fused.
    Under tensor parallelism (`get_tp_group()` of more than one rank) `config` is the rank's local
    one (distributed/sharding.py: its heads and intermediate sizes; vocab_size stays the full one).
    A pipeline stage (`get_pp_stage()`) builds only its layers (the others are empty placeholders, so
    parameter names and KV-cache indices stay the checkpoint's), the embedding only on the first
    stage and the final norm only on the last.
    """

    def __init__(self, config: ModelConfig, block_size: int, max_model_len: int,
                 quant_config: Optional[QuantConfig], make_mlp, rope):
        super().__init__()
        group, self.stage = get_tp_group(), get_pp_stage()
        if self.stage.is_first:
            self.embed_tokens = (make_embedding(config.vocab_size, config.hidden_size, quant_config) if group.size == 1
                                 else VocabParallelEmbedding(config.vocab_size, config.hidden_size, group))
        self.attn_backend = select_attention_backend(config.num_attention_heads, config.num_key_value_heads,
                                                     config.head_dim, block_size)
        self.layers = paddle.nn.LayerList([
            DecoderLayer(config, i, rope, self.attn_backend, make_mlp(config, i, quant_config, f"model.layers.{i}.mlp"),
                         quant_config, f"model.layers.{i}") if i in self.stage.layers else paddle.nn.Layer()
            for i in range(config.num_hidden_layers)])
        if self.stage.is_last:
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        held = self.layers[self.stage.layers.start : min(self.stage.layers.stop, config.num_hidden_layers)]
        self.runs = plan_layer_runs(held, self.attn_backend, fuse=group.size == 1)

    def forward(self, input_ids: Optional[paddle.Tensor], positions: paddle.Tensor, forward_meta: ForwardMeta,
                inputs_embeds: Optional[paddle.Tensor] = None) -> paddle.Tensor:
        """On a stage after the first, `inputs_embeds` is the previous stage's output; on a stage
        before the last the result is this stage's layers' output (the residual stream added in:
        the next stage's first layer starts from it as the first layer starts from the embeddings)."""
        forward_meta.attn_metadata = self.attn_backend.init_attention_metadata(forward_meta)
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)  # [n, hidden]
        residual = None
        for run in self.runs:
            hidden, residual = run(positions, hidden, residual, forward_meta)
        if not self.stage.is_last:
            return hidden + residual
        hidden, _ = self.norm(hidden, residual)
        return hidden


class CausalLM(paddle.nn.Layer):
    # checkpoint tensors every model ignores on purpose
    IGNORED_WEIGHTS = ("rotary_emb.inv_freq",)
    has_lm_head = True  # False for pooling models (models/pooling_adapters.py): they read hidden states

    @classmethod
    def adapt_config(cls, config: ModelConfig) -> ModelConfig:
        """The config with the flags this architecture implies (none by default)."""
        return config

    def __init__(self, config: ModelConfig, block_size: int, max_model_len: int,
                 quant_config: Optional[QuantConfig] = None):
        super().__init__()
        self.config = config = self.adapt_config(config)
        self.model = DecoderModel(config, block_size, max_model_len, quant_config, self.make_mlp,
                                  self.make_rope(config, max_model_len))
        self.tp_group = get_tp_group()  # more than one rank: lm_head holds this rank's vocabulary rows
        self.embedding_reads_lm_head = False
        if self.has_lm_head:
            self._build_lm_head(config, quant_config)

    def _build_lm_head(self, config: ModelConfig, quant_config: Optional[QuantConfig]) -> None:
        # lm_head W [hidden, vocab]: a transposed copy of the embedding when tied (25% faster GEMM on
        # CPU than the embedding's [vocab, hidden]), or the embedding's GGUF blocks
        source = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
        method = select_linear_method(quant_config, [source])
        stage = self.model.stage
        # one packed or GGUF copy serves both (each rank: its rows); a first pipeline stage before the
        # last holds it for its embedding alone, in the format one process would
        self.embedding_reads_lm_head = config.tie_word_embeddings and reads_rows(method) and stage.is_first
        if not (stage.is_last or self.embedding_reads_lm_head):
            return
        self.lm_head = Linear(config.hidden_size, {None: local_vocab_size(config.vocab_size, self.tp_group)},
                              config.lm_head_bias and stage.is_last, method)
        if self.embedding_reads_lm_head:  # the embedding DecoderModel built gives way: its objects are kept for reuse
            release_parameters(self.model.embed_tokens.parameters())
            tied = TiedEmbedding(self.lm_head)
            self.model.embed_tokens = tied if self.tp_group.size == 1 else VocabParallelEmbedding(
                config.vocab_size, config.hidden_size, self.tp_group, tied)

    def make_mlp(self, config: ModelConfig, layer_index: int, quant_config: Optional[QuantConfig],
                 prefix: str) -> paddle.nn.Layer:
        """The MLP of layer `layer_index`, its checkpoint names under `prefix` (a dense SwiGLU by default)."""
        return DenseMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, quant_config, prefix)

    def make_rope(self, config: ModelConfig, max_model_len: int):
        """The RoPE shared by all layers (1-D positions by default; layers/rotary_embedding.py)."""
        return RotaryEmbedding(config.head_dim, config.rope_theta, max_model_len, config.rope_scaling)

    def forward(self, input_ids: Optional[paddle.Tensor], positions: paddle.Tensor, forward_meta: ForwardMeta,
                inputs_embeds: Optional[paddle.Tensor] = None) -> paddle.Tensor:
        """Final hidden states [num_tokens, hidden] (after the last norm); writes this step's K/V into
        forward_meta.caches. See models/__init__.py for the arguments."""
        return self.model(input_ids, positions, forward_meta, inputs_embeds)

    def embed_input_ids(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        """input_ids [num_tokens] int64 -> embeddings [num_tokens, hidden] float32."""
        return self.model.embed_tokens(input_ids)

    def compute_logits(self, hidden: paddle.Tensor) -> paddle.Tensor:
        """hidden [m, hidden] (rows of forward's output) -> logits [m, vocab] float32 (lm_head + bias),
        gathered from every rank under tensor parallelism."""
        logits = self.lm_head(hidden)
        return logits if self.tp_group.size == 1 else gather_logits(logits, self.tp_group, self.config.vocab_size)

    # ---- weight loading -------------------------------------------------------------------
    def transform_weight(self, name: str, array):
        """A checkpoint tensor as this model stores it (identity by default)."""
        return array

    def load_weights(self, weights: Iterable[tuple[str, object]]) -> None:
        """Fill every parameter from (checkpoint name, float32 array or QuantizedTensor in HF [out, in]
        layout) pairs, one at a time, through each parameter's weight_loader(param, tensor, shard_id).

        A tied lm_head is filled from the embedding. Raises ValueError naming the tensor for an unknown
        name, a wrong shape, or (at the end) the checkpoint tensors that never came.
        """
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name.endswith(self.IGNORED_WEIGHTS):
                continue
            param_name, shard = parameter_of(name)
            tied = (name == "model.embed_tokens.weight" and self.config.tie_word_embeddings
                    and "lm_head.weight" in params)
            # no embedding parameter: it reads lm_head's rows, or this pipeline stage has no embedding
            if param_name in params or not tied:
                if param_name not in params:
                    raise ValueError(f"checkpoint tensor {name!r} is not a parameter of {self.config.architecture}")
                self._load(name, params[param_name], tensor, shard)
                loaded.add(name)
            if tied:
                self._load("lm_head.weight", params["lm_head.weight"], tensor, None)
                loaded.add("lm_head.weight")
        missing = sorted(set(self.expected_weight_names()) - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensor(s) of the model, e.g. {missing[:5]}")

    def _load(self, name: str, param: paddle.Tensor, tensor, shard) -> None:
        try:
            param.weight_loader(param, self.transform_weight(name, tensor), shard)
        except ValueError as e:
            raise ValueError(f"checkpoint tensor {name!r} {e}") from None

    def expected_weight_names(self) -> list[str]:
        """Every checkpoint tensor the model needs (HF names), in parameter order."""
        return [ckpt for name, _ in self.named_parameters() for ckpt in checkpoint_names_of(name)]


def with_flags(config: ModelConfig, **flags) -> ModelConfig:
    return dataclasses.replace(config, **flags)
