"""Stand-ins of the VL tests: an executor that records what reaches the runner, a fake model step for
scheduler tests, and random images."""
import numpy as np

from fastdeploy.worker.output import ModelRunnerOutput


class RecordingExecutor:
    """Executor stand-in: answers every sampling position with token `TOKEN` and records each
    NewRequestData it is sent (the runner's view of a request)."""

    TOKEN = 40
    sent: list = []
    max_concurrent_batches = 1  # one step at a time

    def __init__(self, config, weights, quant_config=None):
        self.totals: dict[str, list[int]] = {}  # req_id -> [tokens in the sequence, tokens computed]

    def execute_model(self, scheduler_output):
        for req_id in scheduler_output.finished_req_ids | scheduler_output.preempted_req_ids:
            self.totals.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            RecordingExecutor.sent.append(new)
            self.totals[new.req_id] = [len(new.prompt_token_ids) + len(new.output_token_ids), new.num_computed_tokens]
        for cached in scheduler_output.scheduled_cached_reqs:
            self.totals[cached.req_id][1] = cached.num_computed_tokens
        sampled = {}
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            state = self.totals[req_id]
            state[1] += n
            if state[1] == state[0]:
                sampled[req_id] = [self.TOKEN]
                state[0] += 1
        return ModelRunnerOutput(sampled_token_ids=sampled)

    def check_health(self):
        pass

    def shutdown(self):
        pass



def apply_step(sched, out):
    sampled = {rid: [7] for rid, n in out.num_scheduled_tokens.items()
               if sched.requests[rid].num_computed_tokens + n == sched.requests[rid].num_tokens}
    sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))
    done = [rid for rid in sampled if len(sched.requests[rid].output_token_ids) == sched.requests[rid].sampling_params.max_tokens]
    sched.finish_requests(done)


def random_image(height, width, seed=0):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))
