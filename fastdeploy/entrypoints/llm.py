"""LLM: FastDeploy's offline entry point. Normalises prompts, applies chat templates, runs the engine.

All input is validated before any request is queued, so a bad item raises without starting work.
The caller's SamplingParams and dicts are never modified: each request gets its own copy.

Thread safety: one LLM drives one engine, which is not reentrant. `generate`, `chat` and
`reset_prefix_cache` hold the LLM's lock for their whole run, so calls from several threads run
one after the other (each gets exactly the outputs it would get alone); a call made from inside a
running call on the same thread raises RuntimeError instead of waiting for itself forever.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Any, Optional, Sequence, Union

from tqdm import tqdm

from fastdeploy.engine.args_utils import EngineArgs
from fastdeploy.engine.engine import LLMEngine
from fastdeploy.engine.pooling_output import (ClassificationRequestOutput, EmbeddingRequestOutput,
                                              PoolingRequestOutput, RewardRequestOutput, ScoringRequestOutput)
from fastdeploy.engine.pooling_params import PoolingParams
from fastdeploy.engine.request import RequestOutput
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.warmup import warm_up
from fastdeploy.entrypoints import chat_utils, scoring
from fastdeploy.input.input_processor import check_text
from fastdeploy.model_executor.models.pooling_adapters import num_labels
from fastdeploy.tool_parsers import tool_choice as tool_choices

logger = logging.getLogger("fastdeploy")
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"

PromptType = Union[str, list[int], dict]
PROMPT_DICT_KEYS = ("prompt", "prompt_token_ids", "multimodal_data")
SERVED_TASKS = {  # a pooling model's task (its head) -> the tasks its LLM methods may run
    "embed": ("embed",), "classify": ("classify", "score", "reward"), "reward": ("reward",)}
# one normalised prompt: (text or None, token ids or None (tokenize the text), images/videos or None)
PromptItem = tuple[Optional[str], Optional[list[int]], Optional[Any]]


class LLM:
    """An offline LLM: `LLM(model=..., **engine_args)`; see EngineArgs for every keyword.

    Raises TypeError for an unknown keyword, FileNotFoundError for a model that is not on this
    machine (nothing is downloaded), ValueError for invalid settings.
    """

    def __init__(self, model: Optional[str] = None, **kwargs: Any):
        configure_logging()
        args = EngineArgs.from_kwargs(model, kwargs)
        self.chat_template = chat_utils.load_chat_template(args.chat_template)  # before the slow load
        self.llm_engine = LLMEngine.from_engine_args(args)
        if args.use_warmup:
            warm_up(self.llm_engine)
        self._lock = threading.Lock()
        self._owner: Optional[int] = None  # ident of the thread running a call, for the reentry check

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache (vLLM's `LLM.reset_prefix_cache`); returns True.
        Waits for a generate/chat running in another thread to finish first."""
        with self._serialised("reset_prefix_cache"):
            return self.llm_engine.reset_prefix_cache()

    def shutdown(self) -> None:
        """Release the engine: the model's weights and its KV cache. Idempotent (a second call does
        nothing); generate, chat and reset_prefix_cache raise RuntimeError afterwards. Waits for a
        call running in another thread. `del llm` releases the same memory without it."""
        with self._serialised("shutdown", allow_shut_down=True):
            engine, self.llm_engine = self.llm_engine, None
            if engine is not None:
                engine.shutdown()

    @contextmanager
    def _serialised(self, what: str, allow_shut_down: bool = False):
        """Hold the LLM's lock for one public call (see the module docstring)."""
        if self.llm_engine is None and not allow_shut_down:
            raise RuntimeError(f"LLM.{what}: this LLM was shut down (LLM.shutdown()); create a new LLM")
        if self._owner == threading.get_ident():
            raise RuntimeError(
                f"LLM.{what} was called while this thread is inside another call on the same LLM "
                "(e.g. from a callback); wait for that call to return, or use a second LLM"
            )
        with self._lock:
            if self.llm_engine is None and not allow_shut_down:  # shut down while this call waited
                raise RuntimeError(f"LLM.{what}: this LLM was shut down (LLM.shutdown()); create a new LLM")
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._owner = None

    # ---- public API ----------------------------------------------------------------------------
    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Complete prompts; one RequestOutput per prompt, in input order.

        prompts: str, list[str], list[int] (token ids), list[list[int]], a dict with "prompt" or
            "prompt_token_ids" (ids win when both are given), or a list of such dicts. Text is
            tokenized without special tokens and without a chat template (FastDeploy's rule).
            For a multimodal model a dict may add "multimodal_data": {"image": [PIL images],
            "video": [path | bytes | {"video": path or bytes, "fps": ..., "max_frames": ...}]}, the
            items filling the prompt's `<|image@placeholder|>` / `<|video@placeholder|>` markers (or
            placeholder tokens) in order (input/vl_processor.py).
        sampling_params: one SamplingParams for all prompts or a list of the same length;
            None uses SamplingParams() defaults.
        """
        with self._serialised("generate"):
            self._check_generative("generate")
            items = self._normalize_prompts(prompts)
            return self._run(items, sampling_params, use_tqdm, what="prompts")

    def chat(
        self,
        messages: Union[list[dict], list[list[dict]]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: bool = True,
        chat_template_kwargs: Optional[dict] = None,
        chat_template: Optional[str] = None,
        tools: Union[dict, list[dict], None] = None,
        tool_choice: Union[str, dict, None] = None,
    ) -> list[RequestOutput]:
        """Answer one conversation (list of message dicts) or a batch (list of conversations).

        Each conversation is rendered with the chat template (the model's, the LLM's
        `chat_template`, or this call's `chat_template`), with the generation prompt and
        `chat_template_kwargs` (e.g. {"enable_thinking": False}) passed to the template.
        `RequestOutput.prompt` is the rendered text. A template that is a missing file raises
        FileNotFoundError; one with a Jinja syntax error, or whose `raise_exception` fires for these
        messages, raises ValueError naming `chat_template` (see chat_utils).
        For a multimodal model, content parts may be {"type": "image_url", "image_url": {"url": ...}}
        and {"type": "video_url", "video_url": {"url": ...}} with file://, data: (base64), plain local
        path or http(s) URLs (multimodal/media.py); they count against `limit_mm_per_prompt`.

        Tools: `tools` (a tool dict or a list, `{"type": "function", "function": {"name",
        "description"?, "parameters"?}}`) reach the template as its `tools` variable, for every
        conversation. `tool_choice`: None or "auto" (the `LLM(tool_call_parser=...)` reads the calls;
        "auto" without one is a ValueError), "none" (nothing parsed), "required" or
        `{"type": "function", "function": {"name": ...}}` (the output is forced by a JSON schema to
        calls, read back into `outputs.tool_calls`; a sampling_params with its own guided_decoding
        is then a ValueError). Assistant messages may carry `tool_calls`, and "tool" messages give
        results (chat_utils). See fastdeploy/tool_parsers/tool_choice.py and docs/offline_inference.md.
        """
        with self._serialised("chat"):
            self._check_generative("chat")
            return self._chat(messages, sampling_params, use_tqdm, chat_template_kwargs, chat_template,
                              tools, tool_choice)

    # ---- pooling models -------------------------------------------------------------------------
    def encode(self, prompts: Union[PromptType, Sequence[PromptType]],
               pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None, use_tqdm: bool = True,
               pooling_task: Optional[str] = None) -> list[PoolingRequestOutput]:
        """Run a pooling model on prompts (the forms of `generate`; text gets the tokenizer's special
        tokens); one output per prompt, in input order. `pooling_task`: "embed", "classify" or "reward";
        None: the model's own (`LLM(convert=)` / its architecture). The output is the task's class
        (EmbeddingRequestOutput: `outputs.embedding`, ...), so `llm.encode(texts)[0].outputs.embedding`
        works on an embedding model as vLLM's does. ValueError on a generative LLM, or for a task the
        model's head does not serve."""
        with self._serialised("encode"):
            task = pooling_task or self._pooling_task("encode")
            return self._pool(prompts, pooling_params, task, use_tqdm, "encode")

    def embed(self, prompts, pooling_params=None, use_tqdm: bool = True,
              truncate_prompt_tokens: Optional[int] = None) -> list[EmbeddingRequestOutput]:
        """Embeddings of prompts (`outputs.embedding`, L2-normalised unless PoolingParams(normalize=False);
        PoolingParams(dimensions=k) truncates Matryoshka models), in input order. `truncate_prompt_tokens`
        sets PoolingParams' field for every prompt."""
        with self._serialised("embed"):
            return self._pool(prompts, pooling_params, "embed", use_tqdm, "embed", truncate_prompt_tokens)

    def classify(self, prompts, pooling_params=None, use_tqdm: bool = True,
                 truncate_prompt_tokens: Optional[int] = None) -> list[ClassificationRequestOutput]:
        """Class probabilities of prompts (`outputs.probs`: softmax over the labels, the sigmoid for one
        label; logits with PoolingParams(activation=False)) from a classification model, in input order."""
        with self._serialised("classify"):
            return self._pool(prompts, pooling_params, "classify", use_tqdm, "classify", truncate_prompt_tokens)

    def reward(self, prompts, pooling_params=None, use_tqdm: bool = True,
               truncate_prompt_tokens: Optional[int] = None) -> list[RewardRequestOutput]:
        """Per-token rewards of prompts (`outputs.score`: the classification head on every token, no
        activation; a whole text's reward is the last entry), in input order."""
        with self._serialised("reward"):
            return self._pool(prompts, pooling_params, "reward", use_tqdm, "reward", truncate_prompt_tokens)

    def score(self, text_1: Union[str, Sequence[str]], text_2: Union[str, Sequence[str]],
              pooling_params: Optional[PoolingParams] = None, use_tqdm: bool = True,
              truncate_prompt_tokens: Optional[int] = None) -> list[ScoringRequestOutput]:
        """Scores of text pairs (`outputs.score`): 1 -> 1, 1 -> N (text_1 paired with each of text_2) or
        N -> N (pairwise). A cross-encoder (a one-label classification model) reads each pair as one
        sequence (the tokenizer's pair template, segment ids 0/1) and gives its probability (the logit with
        PoolingParams(activation=False)); an embedding model gives the cosine similarity of the two
        texts' embeddings. ValueError for empty or unequal lists."""
        with self._serialised("score"):
            plan = self._score_plan(scoring.score_pairs(text_1, text_2), pooling_params, truncate_prompt_tokens)
            return plan.scores(self._execute(plan.requests, use_tqdm))

    def _score_plan(self, pairs: list[tuple[str, str]], pooling_params: Optional[PoolingParams],
                    truncate_prompt_tokens: Optional[int]) -> scoring.ScorePlan:
        """The validated prompts that score `pairs` (scoring.py); ValueError as LLM.score raises it."""
        if self._pooling_task("score") == "embed":
            texts = scoring.distinct_texts(pairs)
            truncate = pooling_params.truncate_prompt_tokens if pooling_params is not None else None
            params = PoolingParams(truncate_prompt_tokens=truncate)  # the cosine reads nothing else
            return scoring.ScorePlan(pairs, self._pooling_requests(texts, params, "embed", "score",
                                                                   truncate_prompt_tokens), texts)
        labels = num_labels(self.llm_engine.config.model_config)
        if labels != 1:
            raise ValueError(f"LLM.score needs a cross-encoder with one label; this model has {labels} "
                             "(use LLM.classify)")
        return scoring.ScorePlan(pairs, self._pooling_requests([a for a, _ in pairs], pooling_params, "score",
                                                               "score", truncate_prompt_tokens,
                                                               pairs=[b for _, b in pairs]))

    def _pool(self, prompts, pooling_params, task: str, use_tqdm: bool, method: str,
              truncate_prompt_tokens: Optional[int] = None) -> list:
        """Validate every prompt as `task`, then run them (the pooling methods' common path)."""
        return self._execute(self._pooling_requests(prompts, pooling_params, task, method, truncate_prompt_tokens),
                             use_tqdm)

    def _pooling_requests(self, prompts, pooling_params, task: str, method: str,
                          truncate_prompt_tokens: Optional[int] = None, pairs: Optional[list] = None) -> list:
        """Every prompt validated as `task` (`pairs`: each prompt's second text), none queued; ValueError
        naming LLM.`method` for a model that does not serve the task, or naming the prompt."""
        served = self._pooling_task(method)
        if task not in SERVED_TASKS[served]:
            raise ValueError(f"LLM.{method} runs task {task!r}, which this {served!r} model does not serve "
                             f"(it serves {list(SERVED_TASKS[served])})")
        items = self._normalize_prompts(prompts)
        params = self._per_request_pooling_params(pooling_params, len(items))
        engine = self.llm_engine
        requests = []
        for i, ((text, ids, mm), p) in enumerate(zip(items, params)):
            if mm is not None:
                raise ValueError(f"prompt {i}: images/videos are not supported by pooling models")
            if truncate_prompt_tokens is not None:
                p = p.clone(truncate_prompt_tokens=truncate_prompt_tokens)
            requests.append(engine.make_pooling_request(text, ids, p.for_task(task), i,
                                                        pairs[i] if pairs is not None else None))
        return requests

    def _per_request_pooling_params(self, pooling_params, count: int) -> list[PoolingParams]:
        if pooling_params is None or isinstance(pooling_params, PoolingParams):
            return [pooling_params or PoolingParams()] * count
        if isinstance(pooling_params, (list, tuple)) and all(isinstance(p, PoolingParams) for p in pooling_params):
            if len(pooling_params) != count:
                raise ValueError(f"prompts and pooling_params must be the same length: {count} prompts, "
                                 f"{len(pooling_params)} pooling_params")
            return list(pooling_params)
        raise TypeError(f"pooling_params must be a PoolingParams or a list of them, got {type(pooling_params).__name__}")

    def _pooling_task(self, method: str) -> str:
        """The pooling model's task; ValueError on a generative LLM."""
        task = self.llm_engine.config.pooling_task
        if task is None:
            raise ValueError(f"LLM.{method} needs a pooling model, but this LLM generates text: build it with "
                             "LLM(model, runner='pooling') or task='embed' / 'classify' / 'score' / 'reward'")
        return task

    def _check_generative(self, method: str) -> None:
        task = self.llm_engine.config.pooling_task
        if task is not None:
            raise ValueError(f"LLM.{method} generates text, but this LLM runs a pooling model (task {task!r}): "
                             "use LLM.encode / embed / classify / score / reward, or build it with "
                             "runner='generate' from a generative checkpoint")

    def _chat(self, messages, sampling_params, use_tqdm, chat_template_kwargs, chat_template, tools, tool_choice):
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise TypeError(f"chat_template_kwargs must be a dict, got {type(chat_template_kwargs).__name__}")
        chat_utils.validate_template_kwargs(chat_template_kwargs)
        tools = tool_choices.validate_tools(tools)
        tool_choice = tool_choices.validate_tool_choice(tool_choice, tools)
        if tool_choice == "auto" and not self.llm_engine.config.tool_call_parser:
            raise ValueError("tool_choice='auto' needs a tool call parser: LLM(tool_call_parser=...)")
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"messages must be a non-empty list of message dicts or of conversations, got {messages!r}")
        conversations = [messages] if chat_utils.is_conversation(messages) else messages
        engine = self.llm_engine
        for i, conversation in enumerate(conversations):
            chat_utils.validate_conversation(conversation, i, engine.input_processor.accepts_multimodal)
            _check_message_texts(conversation, i)
        template = chat_utils.load_chat_template(chat_template) or self.chat_template
        params = self._per_request_params(sampling_params, len(conversations), "messages")
        forced = tool_choices.forces_call(tool_choice)
        if forced:
            params = _forced_call_params(params, tools, tool_choice)
        items = [self._render_chat(c, template, chat_template_kwargs, i, tools) for i, c in enumerate(conversations)]
        reader = tool_choices.forced_call_reader(tool_choice) if forced else None

        def read_calls(request_id: str) -> None:  # the output processor reads the forced JSON, or nothing
            self.llm_engine.output_processor.set_tool_call_reader(request_id, reader)

        return self._run(items, params, use_tqdm, what="messages",
                         on_queued=read_calls if tool_choice == "none" or forced else None)

    def _render_chat(self, conversation: list[dict], template: Optional[str], chat_template_kwargs: Optional[dict],
                     index: int, tools: Optional[list[dict]] = None) -> PromptItem:
        """(prompt text, None, images/videos) of one validated conversation: the template (or the model's)
        applied with the generation prompt; the input processor tokenizes it without special tokens.
        Media parts are counted against the limits, then fetched (all before any request is queued)."""
        processor = self.llm_engine.input_processor
        parts = chat_utils.media_parts(conversation)
        if parts and not processor.accepts_multimodal:
            raise ValueError(f"conversation {index} holds image/video parts, but this model takes text only")
        text = chat_utils.render_conversation(self.get_tokenizer(), conversation, template, chat_template_kwargs, index,
                                              tools)
        if not parts:
            return text, None, None
        processor.check_limits({m: sum(1 for kind, _ in parts if kind == m) for m in ("image", "video")}, index)
        return text, None, processor.load_media(parts)

    # ---- helpers ---------------------------------------------------------------------------------
    def _normalize_prompts(self, prompts) -> list[PromptItem]:
        if prompts is None:
            raise ValueError("prompts must be given: a str, list of str, token ids, or dicts")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        elif isinstance(prompts, (list, tuple)) and prompts and _is_token_id(prompts[0]):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError(f"prompts must be a non-empty str, list or dict, got {prompts!r}")
        return [self._normalize_one(p, i) for i, p in enumerate(prompts)]

    def _normalize_one(self, prompt, index: int) -> PromptItem:
        if isinstance(prompt, str):
            return prompt, None, None
        if isinstance(prompt, (list, tuple)):
            if not all(_is_token_id(t) for t in prompt):
                raise TypeError(f"prompt {index}: a token-id prompt must be a list of ints, got {prompt!r}")
            return None, list(prompt), None
        if isinstance(prompt, dict):
            unknown = sorted(set(prompt) - set(PROMPT_DICT_KEYS))
            if unknown:
                raise ValueError(f"prompt {index}: unknown key(s) {unknown}; accepted: {list(PROMPT_DICT_KEYS)}")
            ids = prompt.get("prompt_token_ids")
            if ids is not None and not isinstance(ids, (list, tuple)):  # a str or dict here is no prompt form
                raise TypeError(f"prompt {index}: 'prompt_token_ids' must be a list of ints, got {type(ids).__name__}")
            mm_data = None
            if prompt.get("multimodal_data") is not None:
                from fastdeploy.input.vl_processor import MultiModalData

                mm_data = MultiModalData.from_dict(prompt["multimodal_data"], index)
            if ids:
                text = prompt.get("prompt")
                return text if isinstance(text, str) else None, self._normalize_one(ids, index)[1], mm_data
            if isinstance(prompt.get("prompt"), str):
                return prompt["prompt"], None, mm_data
            raise ValueError(f"prompt {index}: a prompt dict needs a 'prompt' str or 'prompt_token_ids', got {prompt!r}")
        raise TypeError(f"prompt {index} has type {type(prompt).__name__}; expected str, list of ints or dict")

    def _per_request_params(self, sampling_params, count: int, what: str) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams()] * count
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != count:
                raise ValueError(
                    f"{what} and sampling_params must be the same length: {count} {what}, "
                    f"{len(sampling_params)} sampling_params"
                )
            for i, p in enumerate(sampling_params):
                if not isinstance(p, SamplingParams):
                    raise TypeError(f"sampling_params[{i}] must be a SamplingParams, got {type(p).__name__}")
            return list(sampling_params)
        raise TypeError(f"sampling_params must be a SamplingParams or a list of them, got {type(sampling_params).__name__}")

    def _run(self, items, sampling_params, use_tqdm: bool, what: str, on_queued=None) -> list[RequestOutput]:
        """Validate, queue and run every item; `on_queued(request_id)` is called as each is queued."""
        params = self._per_request_params(sampling_params, len(items), what)
        engine = self.llm_engine
        # every request is validated (params re-checked: fields may be edited after construction)
        # before any is queued
        requests = [engine.make_request(text, ids, p, i, mm) for i, ((text, ids, mm), p) in enumerate(zip(items, params))]
        return self._execute(requests, use_tqdm, on_queued)

    def _execute(self, requests: list, use_tqdm: bool, on_queued=None) -> list:
        """Queue validated requests (PreparedPrompts) and step the engine until all are done; outputs in
        input order. Whatever is unfinished when this returns or raises is aborted."""
        engine = self.llm_engine
        order = {}
        results: list = [None] * len(requests)
        bar = _ProgressBar(len(requests)) if use_tqdm else None
        try:
            for i, request in enumerate(requests):
                request_id = engine.enqueue(request)
                order[request_id] = i
                if on_queued is not None:
                    on_queued(request_id)
            while engine.has_unfinished_requests():
                for output in engine.step():
                    results[order[output.request_id]] = output
                    if bar:
                        bar.update(output)
        finally:
            if bar:
                bar.close()
            for request_id in order:  # after an interruption, release what is still queued
                engine.abort_request(request_id)
        return results


def configure_logging() -> None:
    """Give the "fastdeploy" logger its own stderr handler, once per process; the root logger and
    every other logger are left as the application set them.

    Records still propagate to the root logger, so an application's (or pytest's) handlers see
    them; our handler prints only while the root logger has no handler, so a record is never
    printed twice. The level is set to INFO only if the application left it unset (NOTSET).
    """
    fd_logger = logging.getLogger("fastdeploy")
    if not any(isinstance(h, _FallbackHandler) for h in fd_logger.handlers):
        handler = _FallbackHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        fd_logger.addHandler(handler)
    if fd_logger.level == logging.NOTSET:
        fd_logger.setLevel(logging.INFO)


class _FallbackHandler(logging.StreamHandler):
    """stderr handler that stays silent once the root logger has handlers (they get the record)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def _check_message_texts(conversation: list[dict], index: int) -> None:
    """`check_text` on every text of a validated conversation, naming its message."""
    for j, message in enumerate(conversation):
        content = message.get("content")
        texts = [content] if isinstance(content, str) else [part["text"] for part in content or []
                                                            if part["type"] == "text"]
        for text in texts:
            check_text(text, f"conversation {index}, message {j}: 'content'")


def _forced_call_params(params: list[SamplingParams], tools: list[dict], tool_choice) -> list[SamplingParams]:
    """Copies of `params` whose output follows tool_choice's JSON schema (tool_parsers/tool_choice.py);
    ValueError where one already has a guided_decoding constraint."""
    schema = tool_choices.tool_choice_schema(tools, tool_choice)
    for i, p in enumerate(params):
        if p.guided_decoding is not None and p.guided_decoding.kind is not None:
            raise ValueError(f"the sampling_params of conversation {i} have guided_decoding ({p.guided_decoding.kind}), "
                             f"but tool_choice={tool_choice!r} constrains the output itself; give one or the other")
    return [tool_choices.forced_params(p, schema) for p in params]


def _is_token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _ProgressBar:
    """tqdm over finished requests, showing input and output tokens/s since the call started and, under
    speculative decoding, the share of draft tokens accepted."""

    def __init__(self, total: int):
        self.bar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True,
                        postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s")
        self.start = time.perf_counter()
        self.input_tokens = 0
        self.output_tokens = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0

    def update(self, output) -> None:
        """One finished RequestOutput (or PoolingRequestOutput: no output tokens)."""
        self.input_tokens += len(output.prompt_token_ids)
        if isinstance(output, RequestOutput):
            self.output_tokens += sum(len(c.token_ids) for c in output.outputs)
            self.draft_tokens += output.metrics.num_draft_tokens
            self.accepted_tokens += output.metrics.num_accepted_tokens
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        postfix = (f"est. speed input: {self.input_tokens / elapsed:.2f} toks/s, "
                   f"output: {self.output_tokens / elapsed:.2f} toks/s")
        if self.draft_tokens:
            postfix += f", accepted drafts: {100 * self.accepted_tokens / self.draft_tokens:.0f}%"
        self.bar.set_postfix_str(postfix)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
