"""The step contract: what the scheduler sends the runner and what comes back pickles and holds no
engine `Request` (so both can cross to worker processes), and a request is sent in full once, then
as per-step diffs."""
import dataclasses
import pickle

import numpy as np

from fastdeploy import SamplingParams
from fastdeploy.engine.request import Request


def _walk(value, seen=None):
    """Every object reachable through dataclass fields, dicts, lists, tuples and sets."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    yield value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        children = [getattr(value, f.name) for f in dataclasses.fields(value)]
    elif isinstance(value, dict):
        children = list(value.keys()) + list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        children = list(value)
    else:
        children = []
    for child in children:
        yield from _walk(child, seen)


def test_step_messages_pickle_and_carry_no_request(smollm_llm, monkeypatch):
    engine = smollm_llm.llm_engine
    original = engine.executor.execute_model
    sent, returned = [], []

    def recording(scheduler_output):
        sent.append(pickle.loads(pickle.dumps(scheduler_output)))
        result = original(scheduler_output)
        returned.append(pickle.loads(pickle.dumps(result)))
        return result

    monkeypatch.setattr(engine.executor, "execute_model", recording)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    out = smollm_llm.generate([{"prompt_token_ids": p} for p in prompts],
                              SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=2), use_tqdm=False)
    for message in sent + returned:
        assert not any(isinstance(v, Request) for v in _walk(message))
    # each request's data goes once, then diffs; the tokens it got back are the outputs
    new_ids = [n.req_id for s in sent for n in s.scheduled_new_reqs]
    assert sorted(new_ids) == sorted(o.request_id for o in out)
    assert [len(s.scheduled_cached_reqs) for s in sent[1:]] == [2, 2]
    for o in out:
        tokens = [t for r in returned for t in r.sampled_token_ids.get(o.request_id, [])]
        assert tokens == o.outputs.token_ids
        assert all(isinstance(r.logprobs[o.request_id].token_logprobs, np.ndarray) for r in returned)
    assert sent[0].scheduled_new_reqs[0].positions.tolist() == list(range(4))
