"""Resolved configuration of one engine: FDConfig = model + cache + scheduler + load settings.

`ModelConfig.from_hf_config` reads a Hugging Face config.json dict, including the variants seen in
the wild: `rope_theta` at the top level or inside `rope_parameters` (transformers >= 5) or
`rope_scaling`; `head_dim` given or derived; tied or untied embeddings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# BERT-style encoders: bidirectional attention within the step, no KV cache (models/bert.py, xlm_roberta.py)
ENCODER_ARCHITECTURES = ("BertModel", "BertForSequenceClassification", "XLMRobertaModel",
                         "XLMRobertaForSequenceClassification", "RobertaModel", "RobertaForSequenceClassification")
# image/video models: a vision tower before the decoder, M-RoPE (models/ernie4_5_vl/, input/vl_processor.py)
VL_ARCHITECTURES = frozenset({"Ernie4_5_VLMoeForConditionalGeneration"})


def _rope_settings(hf: dict) -> tuple[float, Optional[dict]]:
    """(rope_theta, scaling dict or None) from any of the places configs keep them."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    theta = hf.get("rope_theta") or params.get("rope_theta") or scaling.get("rope_theta") or 10000.0
    spec = {**scaling, **params}
    rope_type = spec.get("rope_type", spec.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope type {rope_type!r} in config.json is not supported; supported: {SUPPORTED_ROPE_TYPES}"
        )
    return float(theta), (None if rope_type == "default" else {**spec, "rope_type": rope_type})


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict]
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # config.json's flag (Llama: biases on q/k/v and o)
    mlp_bias: bool = False
    use_bias: bool = False  # ERNIE-4.5: biases on every linear layer
    # what the layers build; set by each model class's adapt_config from the flags above
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    lm_head_bias: bool = False
    hf_config: dict = field(default_factory=dict, repr=False)  # config.json, for model-specific keys

    @classmethod
    def from_hf_config(cls, hf: dict) -> "ModelConfig":
        """The decoder's settings from config.json; a multimodal config's nested `text_config` (HF's
        vision-language layout) is read as if its keys were at the top level."""
        if isinstance(hf.get("text_config"), dict):
            hf = {**hf, **hf["text_config"]}
        architectures = hf.get("architectures") or []
        if not architectures:
            raise ValueError("config.json has no 'architectures' entry; cannot tell which model to build")
        try:
            heads = hf["num_attention_heads"]
            theta, scaling = _rope_settings(hf)
            return cls(
                architecture=architectures[0],
                vocab_size=hf["vocab_size"],
                hidden_size=hf["hidden_size"],
                intermediate_size=hf["intermediate_size"],
                num_hidden_layers=hf["num_hidden_layers"],
                num_attention_heads=heads,
                num_key_value_heads=hf.get("num_key_value_heads") or heads,
                head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
                rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
                rope_theta=theta,
                rope_scaling=scaling,
                max_position_embeddings=hf.get("max_position_embeddings", 2048),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                attention_bias=bool(hf.get("attention_bias", False)),
                mlp_bias=bool(hf.get("mlp_bias", False)),
                use_bias=bool(hf.get("use_bias", False)),
                hf_config=dict(hf),
            )
        except KeyError as e:
            raise ValueError(f"config.json lacks the required key {e.args[0]!r}") from None

    @property
    def encoder_only(self) -> bool:
        """A BERT-style encoder (no KV cache: it attends within each step's prompts)."""
        return self.architecture in ENCODER_ARCHITECTURES

    @property
    def num_labels(self) -> int:
        """A classification head's outputs: len(id2label) (what transformers writes), else `num_labels`, else 2
        (transformers' default)."""
        id2label = self.hf_config.get("id2label")
        return len(id2label) if id2label else int(self.hf_config.get("num_labels", 2))

    @property
    def position_offset(self) -> int:
        """Added to 0-based positions to index the position table: RoBERTa's pad_token_id + 1 (its positions
        start after padding_idx), 0 for every other model."""
        if "Roberta" not in self.architecture:
            return 0
        pad = self.hf_config.get("pad_token_id")
        return (1 if pad is None else int(pad)) + 1

    @property
    def max_sequence_length(self) -> int:
        """Tokens the position table serves: max_position_embeddings less the position offset."""
        return self.max_position_embeddings - self.position_offset

    def weight_bytes(self, linear_bytes: float = 4.0, lm_head_bytes: Optional[float] = None) -> int:
        """Bytes of the weights as loaded: linear layers (the decoder's, and a multimodal model's vision
        encoder: encoder_bytes) and lm_head at `linear_bytes` per weight, norms in float32, the embedding
        in float32 (also when tied: lm_head is a transposed copy) unless the linear layers are packed
        (bf16, wint8, wint4) and the embedding is tied, when it reads lm_head's copy; lm_head at
        `lm_head_bytes` per weight when given (wint4 models keep lm_head in wint8)."""
        h, d = self.hidden_size, self.head_dim
        attention = h * d * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        hf = self.hf_config
        experts = hf.get("num_experts") or hf.get("num_local_experts") or hf.get("moe_num_experts") or 0
        shared = self.hf_config.get("moe_num_shared_experts", 0)
        inter = hf.get("moe_intermediate_size", 0)
        if isinstance(inter, list):  # ERNIE-4.5-VL: [text, vision] sizes, experts per modality, shared as text
            per_modality = experts if isinstance(experts, list) else [experts, experts]
            experts, inter = 1, sum(e * i for e, i in zip(per_modality, inter)) + shared * inter[0]
            shared = 0
        mlp = 3 * h * max(self.intermediate_size, (experts + shared) * inter)
        per_layer = attention + mlp  # every layer counted as MoE when the model has experts
        embedding = 0 if self.tie_word_embeddings and linear_bytes != 4 else 4 * self.vocab_size * h
        norms = 4 * (2 * self.num_hidden_layers * h + h)
        lm_head = (linear_bytes if lm_head_bytes is None else lm_head_bytes) * self.vocab_size * h
        return int(linear_bytes * self.num_hidden_layers * per_layer + lm_head + embedding + norms
                   + self.encoder_bytes(linear_bytes))

    def encoder_bytes(self, linear_bytes: float) -> int:
        """Bytes of a multimodal model's vision tower and resampler (ERNIE-4.5-VL; 0 for text models): linear
        weights at `linear_bytes` per weight, except where the format cannot take their in_features (under
        1 byte, i.e. wint4: a multiple of 32, else they stay float32), the rest float32."""
        if self.architecture != "Ernie4_5_VLMoeForConditionalGeneration":
            return 0
        from fastdeploy.model_executor.models.ernie4_5_vl.config import encoder_parameters

        linears, others = encoder_parameters(self.hf_config)
        held = [4.0 if linear_bytes < 1 and k % 32 else linear_bytes for k, _ in linears]
        return int(sum(b * k * n for b, (k, n) in zip(held, linears)) + 4 * others)

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """KV-cache bytes one token takes over all layers (K and V); 0 for an encoder."""
        if self.encoder_only:
            return 0
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes


POOLING_TYPES = ("LAST", "CLS", "MEAN", "ALL")  # which token rows become a sequence's vector
POOLING_TASKS = ("embed", "classify", "reward")  # what a pooling model's head gives (`LLM(convert=)`)


@dataclass
class PoolerConfig:
    """How a pooling model turns a prompt's hidden states into its output (vLLM's PoolerConfig, FastDeploy's
    override_pooler_config), resolved once at engine start (engine/pooling_setup.py).

    Attributes:
        task: "embed" (a vector per prompt), "classify" (the model's classification head on the pooled
            row: `LLM.classify`, `LLM.score` for one-label cross-encoders) or "reward" (that head on every
            token, `LLM.reward`).
        pooling_type: "LAST" (the last token's row), "CLS" (the first), "MEAN" (the mean of all rows) or
            "ALL" (every row).
        normalize: L2-normalise embeddings unless a request's PoolingParams says otherwise.
        activation: apply the head's activation to classification logits (softmax over labels, sigmoid for
            one label) unless a request says otherwise.
        dimensions: Matryoshka truncation every embedding gets unless a request asks for its own.
        matryoshka_dimensions: the sizes the model was trained to be truncated to (config.json's
            `matryoshka_dimensions`), None when any size up to hidden is allowed (`is_matryoshka`), or
            () when the model does not support truncation.
        max_seq_length: the length a sentence-transformers model was trained to (its pipeline's
            max_seq_length; the default max_model_len's cap), None without one.
    """

    task: str
    pooling_type: str
    normalize: bool = True
    activation: bool = True
    dimensions: Optional[int] = None
    matryoshka_dimensions: Optional[tuple] = ()
    max_seq_length: Optional[int] = None


@dataclass
class CacheConfig:
    """The KV cache: the user's settings (EngineArgs), then the pool's size and dtype, which the engine
    sets once at start from the model, the weight format and memory (cache_manager/kv_cache_sizing.py)."""

    block_size: int
    num_gpu_blocks_override: Optional[int]  # the pool's size as the user gave it; None: sized from memory
    gpu_memory_utilization: float
    kv_cache_ratio: float
    num_blocks: Optional[int] = None  # the pool's size, including the null block 0; None until sized
    dtype: str = "float32"  # of the KV cache: "float32", or "bfloat16" for models computing in bf16


@dataclass
class SchedulerConfig:
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0  # resolved by EngineArgs; 0 = no per-request cap


def check_keys(name: str, value, allowed: tuple) -> None:
    """TypeError unless `value` is a dict; ValueError naming the keys outside `allowed` (setting `name`)."""
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict, got {type(value).__name__}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ValueError(f"{name} has unknown key(s) {unknown}; accepted: {list(allowed)}")


@dataclass
class DraftModelConfig:
    """A draft model resolved at engine start (speculative_config method "draft_model"): its path,
    its ModelConfig, the weight format it loads in (its quant_config for the model builder) and its KV
    cache's dtype. Its cache has the target's blocks (the same block ids and tables), sized with it."""

    path: str
    model_config: "ModelConfig"
    quant_config: object
    kv_cache_dtype: str
    weights_bytes: int


SPECULATIVE_METHODS = ("ngram", "draft_model", "mtp")
MAX_SPECULATIVE_TOKENS = 15  # k + 1 verified rows stay below the GGUF kernels' 16-row switch
SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "model", "max_ngram_size", "min_ngram_size",
                    "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size")


@dataclass
class SpeculativeConfig:
    """Speculative decoding (`LLM(speculative_config={...})`, docs/speculative_decoding.md).

    Attributes:
        method: "ngram" (prompt lookup over the prompt and the output so far; FastDeploy's
            "ngram_match" is the same), "draft_model" (a smaller zoo checkpoint sharing the tokenizer,
            `model`) or "mtp" (the checkpoint's own next-token-prediction layers).
        num_speculative_tokens: k, the drafts proposed per step (1..15).
        model: the draft checkpoint (draft_model), as `LLM(model=)` takes it.
        min_ngram_size, max_ngram_size: the n-gram lengths ngram matches, longest first (FastDeploy's
            names; vLLM's prompt_lookup_min / prompt_lookup_max are the same settings).
        disable_by_batch_size: no request speculates in a step while more than this many run (vLLM's
            key); None: every batch size.
    """

    method: str
    num_speculative_tokens: int
    model: Optional[str] = None
    min_ngram_size: int = 2
    max_ngram_size: int = 5
    disable_by_batch_size: Optional[int] = None
    draft: Optional[DraftModelConfig] = None  # "draft_model": resolved by the engine at start

    @classmethod
    def from_dict(cls, spec: dict) -> "SpeculativeConfig":
        """Parse FastDeploy's and vLLM's keys. ValueError naming the key for an unknown key, a bad
        value, a missing draft model or ngram sizes out of order; TypeError when `spec` is no dict."""
        check_keys("speculative_config", spec, SPECULATIVE_KEYS)
        method = spec.get("method")
        method = method.lower() if isinstance(method, str) else method
        method = "ngram" if method == "ngram_match" else method
        if method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {list(SPECULATIVE_METHODS)}, "
                             f"got {spec.get('method')!r}")
        if "num_speculative_tokens" not in spec:
            raise ValueError("speculative_config['num_speculative_tokens'] is required: the drafts per step, "
                             f"an int in [1, {MAX_SPECULATIVE_TOKENS}]")
        k = _int_key(spec, "num_speculative_tokens", 1, MAX_SPECULATIVE_TOKENS, default=None)
        model = spec.get("model")
        if method == "draft_model" and not (isinstance(model, str) and model):
            raise ValueError("speculative_config['model'] must name the draft checkpoint (a path or a name in "
                             f"the local Hugging Face cache) when method is 'draft_model', got {model!r}")
        if model is not None and not isinstance(model, str):
            raise ValueError(f"speculative_config['model'] must be a str, got {model!r}")
        low = _int_key(spec, "min_ngram_size", 1, None, default=2)
        high = _int_key(spec, "max_ngram_size", 1, None, default=5)
        vllm_low = _int_key(spec, "prompt_lookup_min", 1, None, default=None)
        vllm_high = _int_key(spec, "prompt_lookup_max", 1, None, default=None)
        if vllm_low is not None or vllm_high is not None:  # vLLM's rule: one given, the other copies it
            low, high = vllm_low or vllm_high, vllm_high or vllm_low
        if low > high:
            raise ValueError(f"speculative_config: the smallest n-gram ({low}) must be <= the largest ({high}) "
                             "(min_ngram_size / prompt_lookup_min <= max_ngram_size / prompt_lookup_max)")
        limit = _int_key(spec, "disable_by_batch_size", 1, None, default=None)
        return cls(method, k, model, low, high, limit)

    @property
    def draft_lookahead(self) -> int:
        """KV slots a request needs past its verified tokens in a step: a draft model writes the K/V of
        its k - 1 later drafts there after the step (ngram: none)."""
        return self.num_speculative_tokens if self.method in ("draft_model", "mtp") else 0


def _int_key(spec: dict, key: str, low: int, high: Optional[int], default):
    """speculative_config[key] as an int in [low, high] (no upper bound when None); `default` when absent
    or None."""
    value = spec.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        allowed = f"an int in [{low}, {high}]" if high is not None else f"an int >= {low}"
        raise ValueError(f"speculative_config[{key!r}] must be {allowed}, got {value!r}")
    return value


@dataclass
class FDConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    model_path: str
    seed: int = 0
    generation_config: dict = field(default_factory=dict)
    max_logprobs: Optional[int] = 20  # most logprobs a request may ask for; -1 = vocabulary; None = off
    logprobs_mode: str = "raw_logprobs"  # or "processed_logprobs", see EngineArgs
    reasoning_parser: Optional[str] = None  # a name of fastdeploy.reasoning, or None
    tool_call_parser: Optional[str] = None  # a name of fastdeploy.tool_parsers, or None
    mm_processor_kwargs: Optional[dict] = None  # multimodal preprocessing settings (input/vl_processor.py)
    limit_mm_per_prompt: Optional[dict] = None  # items per prompt per modality, merged over 1 each
    tensor_parallel_size: int = 1  # ranks each pipeline stage's layers are split over
    pipeline_parallel_size: int = 1  # stages the layers are split into (contiguous ranges; docs/parallelism.md)
    master_addr: str = "127.0.0.1"  # where rank 0 listens for the others to join (MASTER_ADDR)
    master_port: Optional[int] = None  # its port (MASTER_PORT); None: a free one, chosen at start
    nnodes: int = 1  # machines the ranks are spread over (this one is node 0; docs/parallelism.md)
    guided_decoding_backend: str = "auto"  # structured outputs: "auto", "guidance", "xgrammar" or "off"
    guided_decoding_disable_any_whitespace: bool = False  # compact JSON for every request
    logits_processors: list = field(default_factory=list)  # class specs (str), run in order (logits_processor/)
    pooler_config: Optional[PoolerConfig] = None  # a pooling model's pooler (engine/pooling_setup.py)
    speculative_config: Optional[SpeculativeConfig] = None  # None: one token per request per step

    @property
    def world_size(self) -> int:
        """Worker ranks: pipeline stages x tensor-parallel ranks (1: the model runs in the engine's process)."""
        return self.pipeline_parallel_size * self.tensor_parallel_size

    @property
    def runner(self) -> str:
        """"pooling" for a pooling model (one with a pooler), else "generate"."""
        return "generate" if self.pooler_config is None else "pooling"

    @property
    def pooling_task(self) -> Optional[str]:
        """The pooling model's task ("embed", "classify", "reward"), None for a generative one."""
        return self.pooler_config.task if self.pooler_config is not None else None
