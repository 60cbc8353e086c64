"""A fake model step for the VL scheduler tests: every request whose whole sequence is computed gets
token 7; requests reaching max_tokens finish."""
from fastdeploy.worker.output import ModelRunnerOutput


def apply_step(sched, out):
    sampled = {rid: 7 for rid, n in out.num_scheduled_tokens.items()
               if sched.requests[rid].num_computed_tokens + n == sched.requests[rid].num_tokens}
    sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))
    done = [rid for rid in sampled if len(sched.requests[rid].output_token_ids) == sched.requests[rid].sampling_params.max_tokens]
    sched.finish_requests(done)
