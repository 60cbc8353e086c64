"""The output side of one completion: its text, logprobs, finish reason and timings."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from fastdeploy.engine.request import RequestMetrics
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.output.detokenizer import IncrementalDetokenizer


@dataclass(eq=False)
class RequestState:
    """One of a prompt's `n` completions, as the output processor tracks it."""

    request_id: str
    group_id: str  # the prompt's request_id (its RequestOutput carries it)
    index: int
    sampling_params: SamplingParams  # resolved: max_tokens is the completion's limit
    eos_token_ids: frozenset
    detokenizer: IncrementalDetokenizer
    metrics: RequestMetrics
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: Optional[list] = None  # [LogprobsDict] per generated token, when requested
    cumulative_logprob: float = 0.0
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    error: Optional[str] = None  # set when the completion failed at run time
    read_tool_calls: Optional[Callable] = None  # (text, reasoning, answer) -> (tool_calls, text); None: no calls
    sent: "Optional[SentSoFar]" = None  # a streamed completion: what its deltas have carried
    thinking_open: bool = False  # streamed, with a reasoning parser: the prompt left the thinking open

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class SentSoFar:
    """How much of a streamed completion its deltas have carried (output/stream_delta.py)."""

    tokens: int = 0
    text: int = 0  # characters of the answer
    reasoning: int = 0  # characters of reasoning_content
    logprobs: int = 0
    finished: bool = False  # the last delta, with the finish_reason, has gone


@dataclass(eq=False)
class GroupState:
    """The `n` completions of one prompt; its RequestOutput is made when all have finished."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    completions: list[RequestState]
    prompt_logprobs: Optional[list] = None  # [num_prompt_tokens] LogprobsDict ([0] None), when requested
    num_cached_tokens: int = 0
    num_input_image_tokens: int = 0  # prompt tokens standing for images
    num_input_video_tokens: int = 0  # and for videos
    stream: bool = False  # deliver a delta RequestOutput every step it advances, not one at the end
    prompt_logprobs_sent: bool = False

    @property
    def finished(self) -> bool:
        return all(c.finished for c in self.completions)
