"""Request state and the output objects of FastDeploy's offline API. Data types only.

`RequestOutput`, `CompletionOutput` and `RequestMetrics` carry the fields documented in
FastDeploy's offline inference docs (sections 2.5-2.7); `finish_reason`, `stop_reason`,
`cumulative_logprob` and `Logprob` follow vLLM. `RequestOutput.outputs` serves both APIs:
FastDeploy's `output.outputs.text` and vLLM's `output.outputs[0].text` / `for c in output.outputs`.
"""
from __future__ import annotations

import enum
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from fastdeploy.engine.pooling_params import PoolingParams
from fastdeploy.engine.sampling_params import SamplingParams


@dataclass
class Logprob:
    """One entry of a logprobs dict (vLLM's `Logprob`).

    Attributes:
        logprob: natural log of the token's probability.
        rank: 1 + the number of tokens strictly more likely than this one (1 = the most likely).
        decoded_token: the token's text alone (`tokenizer.decode([token_id])`).
    """

    logprob: float
    rank: int
    decoded_token: Optional[str] = None


# Per position, {token_id: Logprob} of the top-k tokens plus the actual token.
LogprobsDict = dict[int, Logprob]


@dataclass
class FunctionCall:
    """The function of one tool call (OpenAI's `tool_calls[i].function`).

    Attributes:
        name: the function's name, as the model wrote it.
        arguments: the arguments as JSON text (a JSON object; non-ASCII characters kept as they are,
            not \\u-escaped); `json.loads(arguments)` gives the dict.
    """

    name: str
    arguments: str = "{}"


@dataclass
class ToolCall:
    """One tool call of a completion (OpenAI's `tool_calls[i]`: id, type, function).

    Attributes:
        function: the called function's name and JSON arguments.
        id: "call_" + 32 random hex digits (OpenAI's and vLLM's form), unique per call.
        type: always "function".
    """

    function: FunctionCall
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex}")
    type: str = "function"

    @classmethod
    def of(cls, name: str, arguments) -> "ToolCall":
        """A call of function `name` with `arguments` (a dict, or any JSON value) serialised as JSON
        with ensure_ascii=False."""
        return cls(function=FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))

    def to_dict(self) -> dict:
        """OpenAI's dict: {"id", "type": "function", "function": {"name", "arguments"}}."""
        return {"id": self.id, "type": self.type,
                "function": {"name": self.function.name, "arguments": self.function.arguments}}


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Timings of one request. Absolute times are `time.time()` seconds; durations are seconds.

    Attributes:
        arrival_time: when the engine received the request.
        inference_start_time: when it was first scheduled into a model step.
        first_token_time: seconds from inference_start_time to the first generated token.
        time_in_queue: seconds from arrival to inference start.
        model_forward_time: seconds from inference start to the last token.
        model_execute_time: seconds from arrival to the last token (queue + inference).
        num_draft_tokens: draft tokens verified (speculative decoding; 0 without), over the prompt's
            completions.
        num_accepted_tokens: those accepted; num_accepted_tokens / num_draft_tokens is the
            acceptance rate. Tokens accepted after a stop are counted though not returned.
    """

    arrival_time: float
    inference_start_time: Optional[float] = None
    first_token_time: Optional[float] = None
    time_in_queue: Optional[float] = None
    model_forward_time: Optional[float] = None
    model_execute_time: Optional[float] = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass
class CompletionOutput:
    """One completion of a prompt.

    Attributes:
        index: index of this completion among the prompt's completions (0 when n = 1).
        send_idx: number of tokens generated when this output was made.
        token_ids: generated token ids (EOS or a stop token included when it ended the request).
        text: detokenized `token_ids`; a stop string, or the text of the EOS or stop token that
            ended the request, left out unless `include_stop_str_in_output`.
        reasoning_content: chain-of-thought text split off by a reasoning parser, else None.
        tool_calls: the tool calls parsed from the answer (`LLM(tool_call_parser=...)`, or
            `LLM.chat(tool_choice="required" | a named function)`), OpenAI's shape; None when none
            was parsed. When calls are parsed, `text` is the answer without the call blocks
            ("" when nothing else was said); see fastdeploy/tool_parsers/.
        finish_reason: "stop" (EOS, stop token or stop string), "length" (max_tokens or
            max_model_len) or "abort"; None while unfinished.
        stop_reason: the stop string or stop token id that matched; None for EOS or length.
        cumulative_logprob: sum of the natural-log probabilities of `token_ids` (same logits as
            `logprobs`); None unless `SamplingParams.logprobs` was set.
        logprobs: list over generated tokens of {token_id: Logprob}: the `logprobs` most likely
            tokens plus the generated one; None unless `SamplingParams.logprobs` was set.
    """

    index: int = 0
    send_idx: int = 0
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[list[LogprobsDict]] = None


class CompletionOutputs(list):
    """The completions of one prompt, ordered by `index`: a list (vLLM) whose attributes are those
    of the first completion (FastDeploy: `output.outputs.text`). With n = 1 both are the same
    completion. `outputs.index` is the first completion's index, as in FastDeploy (list's
    `index()` method stays reachable as `list.index(outputs, x)`)."""

    @property
    def index(self) -> int:  # shadows list.index: FastDeploy code reads `output.outputs.index`
        return self[0].index

    def __getattr__(self, name: str):
        if name.startswith("__") or not self:
            raise AttributeError(name)
        return getattr(self[0], name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self[0], name, value)


@dataclass
class RequestOutput:
    """The result of one prompt, returned by `LLM.generate` / `LLM.chat` in input order.

    Attributes:
        request_id: the engine's id of the request.
        prompt: the prompt as given (text; for chat, the rendered template; None for token input).
        prompt_token_ids: the prompt's token ids.
        prompt_logprobs: list over prompt tokens of {token_id: Logprob} (the first is None);
            None unless `SamplingParams.prompt_logprobs` was set.
        outputs: the `n` completions (CompletionOutputs: `outputs[i]`, or `outputs.text` for the
            first).
        finished: whether generation has ended.
        metrics: timings.
        num_cached_tokens: prompt tokens served from the prefix cache (0 when it is off).
        num_input_image_tokens: prompt tokens standing for images (FastDeploy's field; 0 for text).
        num_input_video_tokens: prompt tokens standing for videos.
        error_code: 200 on success, 500 when the request failed at run time (its output then holds
            what was generated before the failure, finish_reason "abort").
        error_msg: what went wrong, or None.
    """

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: CompletionOutputs
    finished: bool
    metrics: RequestMetrics
    prompt_logprobs: Optional[list[Optional[LogprobsDict]]] = None
    num_cached_tokens: int = 0
    num_input_image_tokens: int = 0
    num_input_video_tokens: int = 0
    error_code: int = 200
    error_msg: Optional[str] = None


class TokenSequence:
    """Prompt + generated tokens of one sequence (a mixin of `Request` and the runner's request state,
    which both have `prompt_token_ids` and `output_token_ids`)."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without copying the whole sequence at decode."""
        num_prompt = len(self.prompt_token_ids)
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        return (self.prompt_token_ids + self.output_token_ids)[start:end]


@dataclass(eq=False)  # identity: requests are compared and hashed as objects
class Request(TokenSequence):
    """Engine-side state of one completion (one of the `n` of a prompt), as the scheduler sees it.

    Its tokens are prompt + generated tokens; the first `num_computed_tokens` are in the KV cache.
    After preemption `num_computed_tokens` drops to 0 and the whole sequence is recomputed.
    Text, logprobs and finish reasons live in the output processor (output/), per-step tensors in
    the model runner (worker/); this object never leaves the engine process.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: Optional[SamplingParams]  # None for a pooling request
    positions: Any  # [num_prompt_tokens] (or [3, num_prompt_tokens]) int64 numpy, from the input processor
    eos_token_ids: frozenset = frozenset()
    index: int = 0  # which of the prompt's n completions
    bad_words_token_ids: list = field(default_factory=list)  # token-id sequences, see bad_words.py
    token_type_ids: Any = None  # [num_prompt_tokens] int64 modality per token, None for text
    mm_features: list = field(default_factory=list)  # MultiModalFeature per image/video, in prompt order
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_blocks_sent: Optional[int] = None  # blocks the runner knows; None: send the request in full
    num_output_sent: int = 0  # generated tokens the runner was sent (CachedRequestData.new_token_ids)
    num_preemptions: int = 0
    num_prompt_logprobs_done: int = 1  # prompt positions scored so far (position 0 has none)
    extra_keys: tuple = ()  # mixed into every block hash; an item's mm_hash goes into the blocks it overlaps
    block_hashes: list = field(default_factory=list)  # prefix-cache keys of the leading full blocks
    prefix_chain_broken: bool = False  # a block's key named other content: register no more blocks
    num_cached_tokens: Optional[int] = None  # prefix-cache hit at first admission
    pooling_params: Optional[PoolingParams] = None  # a pooling request's resolved PoolingParams
    spec_token_ids: list[int] = field(default_factory=list)  # drafts proposed for its next step
    spec_state: Any = None  # the speculation policy's record of its recent drafts (spec_decode/policy.py)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Scores the prompt's tokens: the first of a prompt's n completions (they share the prompt),
        when its sampling params ask for prompt logprobs."""
        return (self.sampling_params is not None and self.sampling_params.prompt_logprobs is not None
                and self.index == 0)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED
