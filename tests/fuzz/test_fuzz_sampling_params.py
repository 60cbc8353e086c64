"""Fuzzing SamplingParams: any mix of valid and invalid keyword values either constructs, or raises
ValueError/TypeError whose message starts with the name of a field that is wrong (alone, or in
combination: greedy temperature with n > 1, min_tokens > max_tokens)."""
import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastdeploy import GuidedDecodingParams, SamplingParams
from fastdeploy.engine.sampling_params import GREEDY_TEMPERATURE_EPS, MAX_SEED

FIELDS = [f.name for f in dataclasses.fields(SamplingParams) if f.init]

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-10**400, max_value=10**400),
    st.sampled_from([10**30, -10**30, 10**400, -(10**400), MAX_SEED, MAX_SEED + 1, -1, -2, 0, 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, 1e-6, -0.0, 0.5, 2.0000001]),
    st.text(max_size=6),
    st.lists(st.one_of(st.integers(-3, 50_000), st.text(max_size=4), st.booleans(), st.floats(), st.none()), max_size=4),
    st.tuples(st.integers(0, 10)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.builds(object),
)

# plausible values per field (valid and near the edges), mixed with junk for every field
guided = st.sampled_from([GuidedDecodingParams(regex="[0-9]+"), GuidedDecodingParams(), {"choice": ["a", "b"]},
                          {"json": {"type": "object"}}, {"choice": []}, {"regex": 5}, {"json": "{}", "regex": "a"},
                          {"kind": "json"}])
plausible = {
    "n": st.integers(-2, 4),
    "temperature": st.floats(-1, 3) | st.sampled_from([0, 0.0, 1e-6, GREEDY_TEMPERATURE_EPS, 1]),
    "top_p": st.floats(-0.5, 1.5) | st.sampled_from([0, 1, 1.0]),
    "top_k": st.integers(-3, 100),
    "min_p": st.floats(-0.5, 1.5) | st.sampled_from([0, 1]),
    "presence_penalty": st.floats(-3, 3) | st.integers(-3, 3),
    "frequency_penalty": st.floats(-3, 3) | st.integers(-3, 3),
    "repetition_penalty": st.floats(-1, 3) | st.integers(-1, 3),
    "max_tokens": st.integers(-2, 64),
    "min_tokens": st.integers(-2, 64),
    "bad_words": st.lists(st.text(max_size=5), max_size=3),
    "bad_words_token_ids": st.lists(st.integers(-2, 50_000), max_size=3),
    "seed": st.integers(-5, MAX_SEED + 5),
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3),
    "stop_token_ids": st.lists(st.integers(-2, 50_000), max_size=3),
    "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "logprobs": st.integers(-3, 25),
    "prompt_logprobs": st.integers(-3, 25),
    "skip_special_tokens": st.booleans(),
    "logit_bias": st.dictionaries(st.integers(-2, 50_000) | st.sampled_from(["7", "x", "-1", ""]),
                                  st.floats(allow_nan=True) | st.integers(-200, 200) | st.sampled_from(["1", None]),
                                  max_size=3),
    "allowed_token_ids": st.lists(st.integers(-2, 50_000), max_size=3),
    "logits_processors_args": st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    "guided_decoding": guided,
    "structured_outputs": guided,
}
assert set(plausible) == set(FIELDS), "a new SamplingParams field needs a strategy here"

kwargs_strategy = st.fixed_dictionaries({}, optional={name: plausible[name] | junk for name in FIELDS})


def error_of(kwargs):
    """The exception SamplingParams(**kwargs) raises, or None."""
    try:
        SamplingParams(**kwargs)
    except Exception as e:  # noqa: BLE001 - the property checks the type
        return e
    return None


def named_field(message: str):
    return next((f for f in FIELDS if message.startswith(f + " ")), None)


@settings(max_examples=600, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(kwargs_strategy)
def test_sampling_params_construct_or_name_the_bad_field(kwargs):
    alone_bad = {name for name, value in kwargs.items() if error_of({name: value}) is not None}
    for name in alone_bad:  # a field wrong on its own is named when given on its own
        e = error_of({name: kwargs[name]})
        assert isinstance(e, (ValueError, TypeError)), f"{name}={kwargs[name]!r}: {type(e).__name__}: {e}"
        assert named_field(str(e)) == name, f"{name}={kwargs[name]!r}: message {e}"
    combo_bad = set()  # fields valid alone but not together
    temperature, n = kwargs.get("temperature"), kwargs.get("n", 1)
    if not {"n", "temperature"} & alone_bad and temperature is not None and temperature < GREEDY_TEMPERATURE_EPS \
            and n > 1:
        combo_bad |= {"n", "temperature"}
    max_tokens, min_tokens = kwargs.get("max_tokens"), kwargs.get("min_tokens", 0)
    if not {"min_tokens", "max_tokens"} & alone_bad and max_tokens is not None and min_tokens > max_tokens:
        combo_bad |= {"min_tokens", "max_tokens"}
    guided = [kwargs.get(name) for name in ("guided_decoding", "structured_outputs")]
    if not {"guided_decoding", "structured_outputs"} & alone_bad and None not in guided and \
            error_of({"guided_decoding": guided[0]}) is None and SamplingParams(guided_decoding=guided[0]).guided_decoding \
            != SamplingParams(guided_decoding=guided[1]).guided_decoding:
        combo_bad |= {"guided_decoding", "structured_outputs"}
    e = error_of(kwargs)
    if not alone_bad and not combo_bad:
        assert e is None, f"valid {kwargs!r} rejected: {type(e).__name__}: {e}"
        params = SamplingParams(**kwargs)
        for name, value in kwargs.items():
            # normalised on construction: logit_bias (int keys, clamped values), the guided_decoding field's two names
            if name not in ("temperature", "logit_bias", "guided_decoding", "structured_outputs"):
                assert getattr(params, name) == value, name
        copy = params.clone()  # tuples become lists; values stay equal
        assert all(list(getattr(copy, f)) == list(getattr(params, f)) if isinstance(getattr(params, f), tuple)
                   else getattr(copy, f) == getattr(params, f) for f in FIELDS)
        return
    assert isinstance(e, (ValueError, TypeError)), f"{kwargs!r}: {type(e).__name__}: {e}"
    assert named_field(str(e)) in alone_bad | combo_bad, f"{kwargs!r}: message {e} names none of {alone_bad | combo_bad}"


@settings(max_examples=200, deadline=None, database=None)
@given(st.sampled_from(FIELDS), junk)
def test_one_junk_value_constructs_or_names_its_field(name, value):
    e = error_of({name: value})
    if e is not None:
        assert isinstance(e, (ValueError, TypeError)), f"{name}={value!r}: {type(e).__name__}: {e}"
        assert named_field(str(e)) == name, f"{name}={value!r}: message {e}"


def test_ints_too_large_for_a_float_are_rejected_naming_the_field():
    """Found by the fuzz test: math.isfinite(10**400) raised OverflowError instead of ValueError."""
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        for value in (10**400, -(10**400)):
            e = error_of({name: value})
            assert isinstance(e, ValueError) and str(e).startswith(name + " must be"), f"{name}={value}: {e!r}"
