"""FastDeploy's logits processors: `LLM(logits_processors=[...])` with the built-in
`LogitBiasLogitsProcessor` and user classes loaded by "module:ClassName", their per-request
`logits_processors_args`, the spec errors, and the run order (declaration order).

The user processors are written here and loaded by this module's name, as a user's would be.
"""
from types import SimpleNamespace

import numpy as np
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.model_executor.logits_processor import LogitsProcessor, apply_processors, build_logits_processors
from helpers import SMOLLM_BLOCK_SIZE, assert_same_greedy, first, greedy, run, top2_gaps

STORY = "Once upon a time"


class BanListed(LogitsProcessor):
    """A user processor: bans the ids in `logits_processors_args["ban"]`; keeps what update_state saw."""

    def __init__(self, fd_config):
        self.vocab_size = fd_config.model_config.vocab_size
        self.ban = []
        self.seen = []

    def update_state(self, rows):
        self.ban = [(i, row.logits_processors_args["ban"]) for i, row in enumerate(rows)
                    if "ban" in row.logits_processors_args]
        self.seen.append([(row.req_id, list(row.prompt_token_ids), list(row.output_token_ids),
                           row.sampling_params.max_tokens) for row in rows])

    def apply(self, logits):
        assert logits.dtype == np.float32 and logits.shape[1] == self.vocab_size
        for row, ids in self.ban:
            logits[row, ids] = -np.inf


class NotAProcessor:
    pass


@pytest.fixture(scope="module")
def lp_llm(smollm_path):
    llm = LLM(model=smollm_path, max_model_len=512, block_size=SMOLLM_BLOCK_SIZE, max_num_seqs=8,
              num_gpu_blocks_override=128, logits_processors=["LogitBiasLogitsProcessor", f"{__name__}:BanListed"])
    yield llm
    llm.shutdown()


def user_processor(llm) -> BanListed:
    runner = llm.llm_engine.executor.runner
    return next(p for p in runner.logits_processors if isinstance(p, BanListed))


# ---- the built-in, FastDeploy's spelling ------------------------------------------------------------
def test_logit_bias_processor_gives_the_tokens_of_vllms_logit_bias(lp_llm, tok):
    target = tok.encode(" castle", add_special_tokens=False)[0]
    fastdeploy = first(lp_llm, STORY, greedy(10, logits_processors_args={"logit_bias": {str(target): 6}}))
    vllm = first(lp_llm, STORY, greedy(10, logit_bias={target: 6.0}))
    plain = first(lp_llm, STORY, greedy(10))
    assert fastdeploy.token_ids == vllm.token_ids != plain.token_ids
    assert target in fastdeploy.token_ids
    forced = first(lp_llm, STORY, greedy(5, logits_processors_args={"logit_bias": {target: 100.0}}))
    assert forced.token_ids == [target] * 5


@pytest.mark.parametrize("args, error, match", [
    ({"logit_bias": [1, 2]}, TypeError, r"prompt 1: logits_processors_args\['logit_bias'\] must be a dict"),
    ({"logit_bias": {"x": 1.0}}, TypeError, r"prompt 1: logits_processors_args\['logit_bias'\]: cannot cast 'x'"),
    ({"logit_bias": {5: "big"}}, TypeError, r"cannot cast 5: 'big'"),
    ({"logit_bias": {5: float("inf")}}, ValueError, r"\['logit_bias'\]\[5\] must be finite"),
    ({"logit_bias": {49152: 1.0}}, ValueError, r"prompt 1: .* token id 49152, outside the vocabulary"),
])
def test_bad_processor_args_are_refused_when_the_request_is_added(lp_llm, args, error, match):
    with pytest.raises(error, match=match):
        run(lp_llm, [STORY, STORY], [greedy(2), greedy(2, logits_processors_args=args)])
    assert not lp_llm.llm_engine.has_unfinished_requests()


def test_processor_args_without_processors_are_refused(smollm_llm):
    with pytest.raises(ValueError, match=r"prompt 0: logits_processors_args was given, but this LLM has no logits "
                                         r"processors"):
        run(smollm_llm, [STORY], greedy(2, logits_processors_args={"logit_bias": {5: 1.0}}))


# ---- a user processor by "module:ClassName" -------------------------------------------------------
def test_user_processor_sees_each_row_and_bans_per_request(lp_llm):
    plain = first(lp_llm, STORY, greedy(6, ignore_eos=True))
    banned = sorted(set(plain.token_ids))
    processor = user_processor(lp_llm)
    processor.seen.clear()
    outs = run(lp_llm, [STORY, STORY], [greedy(6, ignore_eos=True, logits_processors_args={"ban": banned}),
                                        greedy(6, ignore_eos=True, logprobs=2)])
    assert not set(outs[0].outputs.token_ids) & set(banned)
    assert outs[1].outputs.token_ids == plain.token_ids  # the other row is left alone
    prompt = lp_llm.get_tokenizer().encode(STORY, add_special_tokens=False)
    assert len(processor.seen) == 6  # one update per step, both rows in each
    for step, rows in enumerate(processor.seen):
        assert len(rows) == 2 and all(r[1] == prompt and r[3] == 6 for r in rows)
        by_req = {r[0]: r[2] for r in rows}
        assert sorted(len(o) for o in by_req.values()) == [step, step]  # output tokens so far
    final = {out.request_id: out.outputs.token_ids for out in outs}
    assert {r[0]: r[2] for r in processor.seen[-1]} == {k: v[:-1] for k, v in final.items()}


def test_batch_with_processor_requests_leaves_the_others_unchanged(lp_llm, tok):
    target = tok.encode(" dragon", add_special_tokens=False)[0]
    prompts = [STORY, "The capital of France is", "def add(a, b):"]
    plain = greedy(8, ignore_eos=True, logprobs=2)
    alone = [first(lp_llm, p, plain) for p in prompts]
    mixed = run(lp_llm, prompts + [STORY], [plain] * 3 + [
        greedy(8, ignore_eos=True, logits_processors_args={"logit_bias": {target: 9.0}, "ban": [13]})])
    for ref, out in zip(alone, mixed[:3]):
        assert_same_greedy(out.outputs.token_ids, ref.token_ids, top2_gaps(ref), "mixed batch")


# ---- specs, order ----------------------------------------------------------------------------------
@pytest.mark.parametrize("specs, error, match", [
    (["NoSuchProcessor"], AttributeError,
     r"Module fastdeploy\.model_executor\.logits_processor does not have attribute NoSuchProcessor"),
    (["no_such_module_xyz:Proc"], ImportError, r"Failed to import module no_such_module_xyz"),
    ([f"{__name__}:Missing"], AttributeError, rf"Module {__name__} does not have attribute Missing"),
    ([":BanListed"], ValueError, r"Invalid spec ':BanListed'; expected 'module:ClassName'\."),
    ([f"{__name__}:"], ValueError, r"Invalid spec .*expected 'module:ClassName'\."),
    ([""], ValueError, r"Invalid spec ''"),
    ([f"{__name__}:NotAProcessor"], TypeError, r"must be a concrete class with update_state\(rows\) and apply"),
    (["LogitsProcessor"], TypeError, r"must be a concrete class"),  # the abstract base
    ([f"{__name__}:STORY"], TypeError, r"must be a concrete class"),
    ([3], TypeError, r"logits_processors entries must be str"),
    ("LogitBiasLogitsProcessor", TypeError, r"logits_processors must be a list"),
])
def test_bad_specs_fail_at_construction(specs, error, match):
    with pytest.raises(error, match=match):
        LLM(logits_processors=specs)  # before any model is loaded


class SetsZero:
    def __init__(self, fd_config):
        pass

    def update_state(self, rows):
        pass

    def apply(self, logits):
        logits[:, 0] = 1.0


class RecordsZero(SetsZero):
    seen = None

    def apply(self, logits):  # FastDeploy's style: a new array returned
        type(self).seen = logits[:, 0].copy()
        out = logits.copy()
        out[:, 0] = 2.0
        return out


def test_processors_run_in_declaration_order():
    config = SimpleNamespace(logits_processors=[f"{__name__}:SetsZero", f"{__name__}:RecordsZero"])
    processors = build_logits_processors(config)
    assert [type(p) for p in processors] == [SetsZero, RecordsZero]
    logits = np.zeros((3, 5), np.float32)
    apply_processors(logits, processors)
    assert (RecordsZero.seen == 1.0).all() and (logits[:, 0] == 2.0).all()  # the second saw the first's edit
    processors.reverse()
    apply_processors(logits, processors)
    assert (RecordsZero.seen == 2.0).all() and (logits[:, 0] == 1.0).all()
