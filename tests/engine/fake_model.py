"""The engine's side of a step for scheduler tests that run no model: the scheduled requests of a
SchedulerOutput, and a fake ModelRunnerOutput applied through `Scheduler.update_from_output`."""
from __future__ import annotations

from typing import Callable

import numpy as np

from fastdeploy.engine.request import Request
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.sched.output import SchedulerOutput
from fastdeploy.engine.sched.scheduler import Scheduler
from fastdeploy.worker.output import ModelRunnerOutput


def text_request(request_id: str, prompt_token_ids: list[int], max_tokens: int) -> Request:
    return Request(request_id=request_id, prompt_token_ids=prompt_token_ids,
                   sampling_params=SamplingParams(max_tokens=max_tokens),
                   positions=np.arange(len(prompt_token_ids), dtype=np.int64))


def scheduled(sched: Scheduler, out: SchedulerOutput) -> list[tuple[Request, int]]:
    """(request, tokens computed for it this step), in schedule order."""
    return [(sched.requests[req_id], n) for req_id, n in out.num_scheduled_tokens.items()]


def apply_step(sched: Scheduler, out: SchedulerOutput, next_token: Callable[[Request], int]) -> list[Request]:
    """Run the step as the model would: every request whose whole sequence is now computed gets
    `next_token(request)`; those that reach max_tokens finish. Returns the finished requests."""
    sampled = {r.request_id: [next_token(r)] for r, n in scheduled(sched, out) if r.num_computed_tokens + n == r.num_tokens}
    sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))
    done = [sched.requests[req_id] for req_id in sampled]
    done = [r for r in done if len(r.output_token_ids) == r.sampling_params.max_tokens]
    sched.finish_requests([r.request_id for r in done])
    return done
