"""speculative_config: FastDeploy's and vLLM's keys, and a clear error for every bad one before
anything loads."""
import pytest

from fastdeploy import LLM
from fastdeploy.config import SpeculativeConfig


def test_keys_and_aliases():
    spec = SpeculativeConfig.from_dict({"method": "NGRAM_MATCH", "num_speculative_tokens": 3})
    assert (spec.method, spec.num_speculative_tokens, spec.min_ngram_size, spec.max_ngram_size) == ("ngram", 3, 2, 5)
    spec = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4})
    assert (spec.min_ngram_size, spec.max_ngram_size) == (4, 4)  # vLLM: one given, the other copies it
    spec = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "min_ngram_size": 1,
                                        "max_ngram_size": 3, "disable_by_batch_size": 4})
    assert (spec.min_ngram_size, spec.max_ngram_size, spec.disable_by_batch_size) == (1, 3, 4)
    assert spec.draft_lookahead == 0
    draft = SpeculativeConfig.from_dict({"method": "draft_model", "model": "/x", "num_speculative_tokens": 5})
    assert draft.draft_lookahead == 5


@pytest.mark.parametrize("spec, words", [
    ({"method": "eagle", "num_speculative_tokens": 2}, ["method", "ngram", "draft_model", "mtp", "eagle"]),
    ({"method": "ngram"}, ["num_speculative_tokens", "required"]),
    ({"method": "ngram", "num_speculative_tokens": 0}, ["num_speculative_tokens", "[1, 15]", "0"]),
    ({"method": "ngram", "num_speculative_tokens": 16}, ["num_speculative_tokens", "16"]),
    ({"method": "ngram", "num_speculative_tokens": True}, ["num_speculative_tokens", "True"]),
    ({"method": "ngram", "num_speculative_tokens": 2, "verify_window": 2}, ["unknown", "verify_window"]),
    ({"method": "ngram", "num_speculative_tokens": 2, "min_ngram_size": 4, "max_ngram_size": 3}, ["(4)", "(3)"]),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, ["prompt_lookup_min", ">= 1"]),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}, ["disable_by_batch_size"]),
    ({"method": "draft_model", "num_speculative_tokens": 2}, ["model", "draft checkpoint"]),
])
def test_bad_settings_name_the_key(spec, words):
    with pytest.raises(ValueError) as error:
        SpeculativeConfig.from_dict(spec)
    for word in words:
        assert word in str(error.value)


def test_llm_refuses_before_loading(monkeypatch):
    import fastdeploy.engine.engine as engine

    monkeypatch.setattr(engine.LLMEngine, "from_engine_args", lambda *a: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 99})
    with pytest.raises(TypeError, match="must be a dict"):
        LLM(speculative_config="ngram")


def test_mtp_names_the_missing_layers(smollm_path):
    with pytest.raises(ValueError, match="num_nextn_predict_layers=0"):
        LLM(smollm_path, speculative_config={"method": "mtp", "num_speculative_tokens": 1})
