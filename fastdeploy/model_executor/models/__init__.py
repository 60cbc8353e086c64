"""Model registry (config.json `architectures[0]` -> model class) and the contract every model keeps.

Models are `paddle.nn.Layer` trees (models/causal_lm.py CausalLM and the layers of layers/), with
parameters named as the checkpoint's tensors after packing: q_proj/k_proj/v_proj fill
`...self_attn.qkv_proj.weight` (shard ids "q", "k", "v"), gate_proj/up_proj fill
`...mlp.gate_up_proj.weight` (shard ids 0, 1); model_loader/packed_modules.py maps the names.
`named_parameters()` and `state_dict()` work as for any Layer.

Build: `model_cls(model_config, block_size, max_model_len, quant_config=None)`
  model_config: config.ModelConfig (ModelConfig.from_hf_config(config.json)); block_size: tokens per
  KV-cache block; max_model_len: longest sequence (RoPE tables); quant_config: how the checkpoint
  stores its tensors (layers/linear.py QuantConfig; a GGUFConfig from the GGUF header,
  `ModelSource.quant_config`), None for float checkpoints. Parameters are created empty (no
  initialisation); what each layer runs is chosen here, once, each kind in one place (a linear method
  or op may still pick its kernel per call by the rows of x: docs/design.md, "Where each kernel choice is made"):
  - each Linear's linear method: layers/linear.py `select_linear_method` (dense float32, or GGUF
    blocks via layers/quantization/gguf.py GGUFConfig.linear_method);
  - the attention backend: layers/append_attention.py `select_attention_backend` (the compiled
    append_attention op, or the pure-Paddle backend);
  - which decoder layers run inside the compiled `fd_decoder_layers` op:
    layers/fused_decoder_layers.py `plan_layer_runs`;
  - the element-wise kernels (RMSNorm, RoPE, SwiGLU: compiled op or Paddle reference), in the
    constructors of layers/normalization.py, rotary_embedding.py and mlp.py.
  A model built inside `ops.fallbacks_forced()` therefore runs only the fallbacks wherever it runs.

Load: `model.load_weights(weights)`, weights an iterable of (checkpoint name, float32 numpy array
  or QuantizedTensor, HF layout: linear weights [out, in]), one tensor at a time; each goes to
  `param.weight_loader(param, tensor, shard_id)`. ValueError naming the tensor for an unknown name,
  a wrong shape, and the missing ones at the end. Tied embeddings fill lm_head too.

Run one step:
  hidden = model(input_ids, positions, forward_meta, inputs_embeds=None)   # [num_tokens, hidden]
  logits = model.compute_logits(paddle.gather(hidden, logits_indices))     # [m, vocab] float32
  input_ids: [num_tokens] int64, or None when inputs_embeds [num_tokens, hidden] float32 is given
  (e.g. `model.embed_input_ids(input_ids)` with multimodal embeddings scattered in; the runner passes
  input_ids too, which a multimodal MoE routes on); positions:
  [num_tokens] int64 RoPE positions (the model never derives them; M-RoPE will pass [3, num_tokens]);
  hidden: after the final norm. Tokens are the step's ragged batch, request by request.
  forward_meta: forward_meta.ForwardMeta.build(seq_lens_this_time [bs], seq_lens_decoder [bs],
  block_tables (lists of block ids), block_size, caches, token_type_ids=None) gives cu_seqlens_q
  [bs + 1], block_tables [bs, max_blocks] (-1 padded) and slot_mapping [num_tokens] (cache slot of
  each new token, from seq_lens_decoder and its offset, not from positions); token_type_ids
  [num_tokens] int64 (0 text, 1 image, 2 video) or None reaches the MoE layers; attn_metadata is
  filled by the model's attention backend at the start of forward.
  KV caches: the runner allocates one layers/attention.py `allocate_kv_cache(num_blocks,
  num_key_value_heads, block_size, head_dim, dtype)` per decoder layer (key/value [num_blocks,
  kv_heads, block_size, head_dim], FastDeploy's layout; float32, or bf16 bits for models computing
  in bf16) and hands the list as `caches`; layer i writes this step's K/V into caches[i] at
  slot_mapping and attends over its blocks.
Pooling models (`get_model_class(architecture, pooling_task)`) have class attribute `encoder_only`
  (True: BERT-style encoders, bidirectional attention, no KV cache), `num_labels` and, with a classification
  head, `classify(pooled [m, hidden]) -> [m, num_labels]` logits; the runner pools their hidden states
  (layers/pooler.py) and never calls compute_logits.
Multimodal models also have `embed_multimodal(features)`: multimodal/inputs.py MultiModalFeature list
  -> one [feature.length, hidden] float32 tensor per feature (the runner's worker/multimodal.py puts
  them at the placeholder rows of inputs_embeds).
"""
from typing import Optional

from fastdeploy.model_executor.models.ernie4_5 import Ernie4_5ForCausalLM
from fastdeploy.model_executor.models.ernie4_5_moe import Ernie4_5_MoeForCausalLM
from fastdeploy.model_executor.models.ernie4_5_vl import Ernie4_5_VLMoeForConditionalGeneration
from fastdeploy.model_executor.models.llama import LlamaForCausalLM
from fastdeploy.model_executor.models.qwen2 import Qwen2ForCausalLM
from fastdeploy.model_executor.models.qwen3 import Qwen3ForCausalLM
from fastdeploy.model_executor.models.pooling_adapters import as_pooling_model
from fastdeploy.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

POOLING_SUFFIXES = ("ForSequenceClassification", "Model")  # decoder spellings of pooling checkpoints

MODEL_REGISTRY = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Ernie4_5ForCausalLM": Ernie4_5ForCausalLM,
    "Ernie4_5_MoeForCausalLM": Ernie4_5_MoeForCausalLM,
    "Ernie4_5_VLMoeForConditionalGeneration": Ernie4_5_VLMoeForConditionalGeneration,
    # the spelling of Baidu's own (remote-code and Paddle-layout) ERNIE-4.5 configs
    "Ernie4_5_ForCausalLM": Ernie4_5ForCausalLM,
}


def get_model_class(architecture: str, pooling_task: Optional[str] = None):
    """The class for `architecture`; with a pooling task ("embed", "classify", "reward"), a pooling model:
    an encoder's own class, or a decoder adapted by models/pooling_adapters.py (`XForSequenceClassification`
    and `XModel` read as `XForCausalLM`'s layers). Raises ValueError listing the supported ones."""
    if pooling_task is not None and not getattr(MODEL_REGISTRY.get(architecture), "encoder_only", False):
        decoder = _decoder_of(architecture)
        if decoder is not None:
            return as_pooling_model(decoder, pooling_task)
    if architecture not in MODEL_REGISTRY:
        raise ValueError(
            f"architecture {architecture!r} is not supported; supported: {sorted(MODEL_REGISTRY)}, and for pooling "
            f"{sorted(n.replace('ForCausalLM', s) for n in MODEL_REGISTRY if n.endswith('ForCausalLM') for s in POOLING_SUFFIXES)}"
        )
    return MODEL_REGISTRY[architecture]


def _decoder_of(architecture: str):
    """The CausalLM class whose layers `architecture` has (itself, or its ForSequenceClassification / base
    Model spelling), or None."""
    for suffix in ("ForCausalLM",) + POOLING_SUFFIXES:
        if architecture.endswith(suffix):
            return MODEL_REGISTRY.get(architecture[: -len(suffix)] + "ForCausalLM")
    return None
