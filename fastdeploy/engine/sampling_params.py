"""SamplingParams: how one request is decoded. Data and validation only, no engine logic.

Field names, defaults and ranges follow FastDeploy's `fastdeploy.engine.sampling_params.SamplingParams`
and vLLM's (`vllm.SamplingParams`), so code written against either works. Every field is checked
in `__post_init__`; a bad value raises ValueError (or TypeError for a wrong type) naming the field,
the value and what is allowed. Checks that need the model (token ids inside the vocabulary,
`logprobs` against the LLM's `max_logprobs`) are made by the engine when the request is added.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Union

MAX_SEED = 922337203685477580  # FastDeploy's bound
# Temperatures below this are greedy (vLLM's _SAMPLING_EPS): logits / 1e-6 reach millions and
# logits / 1e-45 overflow float32 to inf (NaN probabilities), while the draw is the argmax anyway.
GREEDY_TEMPERATURE_EPS = 1e-5


MAX_N = 1024  # completions per prompt; each is a request of its own (a huge n would run for ever)
MAX_LOGIT_BIAS = 100.0  # logit_bias values are clamped to [-100, 100] (OpenAI's range, vLLM's clamp)


def _check_type(name: str, value, types: tuple, allowed: str) -> None:
    if isinstance(value, bool) and bool not in types:
        raise TypeError(f"{name} must be {allowed}, got {value!r} (bool)")
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")


def _check_number(name: str, value, ok, allowed: str) -> None:
    """TypeError unless a finite int/float; ValueError unless ok(value)."""
    _check_type(name, value, (int, float), f"a number {allowed}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float: no allowed range reaches it
        finite = False
    if not finite or not ok(value):
        raise ValueError(f"{name} must be {allowed}, got {value}")


def _check_token_ids(name: str, ids) -> None:
    if not isinstance(ids, (list, tuple)) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
    ):
        raise TypeError(f"{name} must be a list of token ids (ints >= 0), got {ids!r}")


def _logit_bias(name: str, bias) -> dict[int, float]:
    """bias as {token id: float in [-100, 100]}: keys int or str of an int (JSON's keys), values numbers
    (clamped, infinities included; NaN refused). TypeError / ValueError naming `name` and the bad key."""
    if not isinstance(bias, dict):
        raise TypeError(f"{name} must be a dict {{token id: bias}}, got {type(bias).__name__}")
    out = {}
    for key, value in bias.items():
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise TypeError(f"{name} keys must be token ids (int, or str of an int), got {key!r} "
                            f"({type(key).__name__})")
        try:
            token = int(key)
        except ValueError:
            raise ValueError(f"{name} keys must be token ids (int, or str of an int), got {key!r}") from None
        if token < 0:
            raise ValueError(f"{name} keys must be token ids >= 0, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} value of {key!r} must be a number, got {value!r} ({type(value).__name__})")
        try:
            number = float(value)
        except OverflowError:  # an int beyond float's range: clamped below like an infinity
            number = math.inf if value > 0 else -math.inf
        if math.isnan(number):
            raise ValueError(f"{name} value of {key!r} must be a number, got nan")
        out[token] = min(MAX_LOGIT_BIAS, max(-MAX_LOGIT_BIAS, number))
    return out


GUIDED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


@dataclass
class GuidedDecodingParams:
    """A constraint on a request's output (structured outputs): FastDeploy's
    `fastdeploy.engine.sampling_params.GuidedDecodingParams`, also importable under vLLM's name
    `StructuredOutputsParams`. Pass it as `SamplingParams(guided_decoding=...)` or
    `SamplingParams(structured_outputs=...)`.

    At most one kind may be set (FastDeploy's ValueError otherwise); none set means no constraint.
    The engine checks the constraint against the model's tokenizer when the request is added: a
    schema, regex or grammar the backend cannot compile is a ValueError naming the prompt and the
    fault, raised before any prompt of the call is queued (structured_output/).

    Attributes:
        json: a JSON schema (dict or its JSON text); the output is one JSON value valid under it.
        json_object: True: the output is one JSON object, any keys (OpenAI's `json_object`).
        regex: the output matches this regular expression in full (Rust `regex` syntax, as
            llguidance reads it; anchors are implied).
        choice: the output is exactly one of these strings.
        grammar: a context-free grammar in the EBNF/GBNF syntax FastDeploy documents (llama.cpp's
            GBNF: `root ::= "yes" | "no"`), or a Lark grammar (llguidance's syntax).
        structural_tag: a JSON string `{"structures": [{"begin", "schema", "end"}], "triggers":
            [...]}` (xgrammar's structural tag): free text, where each trigger starts a `begin`,
            a JSON value under `schema`, then `end`.
        disable_any_whitespace: vLLM's option: no whitespace between JSON tokens (the engine-wide
            `LLM(guided_decoding_disable_any_whitespace=True)` sets it for every request).
        disable_additional_properties: vLLM's option: objects of the schema take only the
            properties it lists (as if `additionalProperties: false` where the schema says nothing).
        whitespace_pattern: vLLM's option: a regex for the whitespace allowed between JSON tokens,
            in place of the engine's bounded default (see structured_output/grammar.py).
    """

    json: Optional[Union[str, dict]] = None
    regex: Optional[str] = None
    choice: Optional[list] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    structural_tag: Optional[str] = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Optional[str] = None

    def __post_init__(self) -> None:
        set_kinds = [name for name in GUIDED_KINDS if self._is_set(name)]
        if len(set_kinds) > 1:
            raise ValueError("You can only use one kind of guided decoding ('json', 'json_object', 'regex', "
                             f"'choice', 'grammar', 'structural_tag'); got {set_kinds}")
        if self.json is not None:
            _check_type("guided_decoding.json", self.json, (str, dict), "a JSON schema (dict or JSON text)")
            if isinstance(self.json, str) and not self.json.strip():
                raise ValueError("guided_decoding.json must not be an empty string")
        for name in ("regex", "grammar", "structural_tag", "whitespace_pattern"):
            value = getattr(self, name)
            if value is not None:
                _check_type(f"guided_decoding.{name}", value, (str,), "a str")
                if not value.strip() and name != "whitespace_pattern":
                    raise ValueError(f"guided_decoding.{name} must not be an empty string")
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not all(isinstance(c, str) for c in self.choice):
                raise TypeError(f"guided_decoding.choice must be a list of str, got {self.choice!r}")
            if not self.choice:
                raise ValueError("guided_decoding.choice must not be an empty list")
            self.choice = list(self.choice)
        if self.json_object is not None:
            _check_type("guided_decoding.json_object", self.json_object, (bool,), "True, False or None")
        for name in ("disable_any_whitespace", "disable_additional_properties"):
            _check_type(f"guided_decoding.{name}", getattr(self, name), (bool,), "True or False")

    def _is_set(self, name: str) -> bool:
        value = getattr(self, name)
        return value is not None and value is not False

    @property
    def kind(self) -> Optional[str]:
        """The constraint's kind (one of GUIDED_KINDS), or None when no kind is set."""
        return next((name for name in GUIDED_KINDS if self._is_set(name)), None)

    def to_dict(self) -> dict:
        """FastDeploy's request keys of the set kind (`guided_json`, `guided_regex`, `guided_choice`,
        `guided_grammar`, `structural_tag`, `guided_json_object`)."""
        keys = {"json": "guided_json", "regex": "guided_regex", "choice": "guided_choice",
                "grammar": "guided_grammar", "structural_tag": "structural_tag", "json_object": "guided_json_object"}
        return {keys[name]: getattr(self, name) for name in GUIDED_KINDS if self._is_set(name)}


StructuredOutputsParams = GuidedDecodingParams  # vLLM's name for the same thing


def _guided(name: str, value) -> Optional[GuidedDecodingParams]:
    """A GuidedDecodingParams from the value of field `name` (an instance, a dict of its fields, or None)."""
    if value is None or isinstance(value, GuidedDecodingParams):
        return value
    if isinstance(value, dict):
        try:
            return GuidedDecodingParams(**value)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name} is invalid: {error}") from None
    raise TypeError(f"{name} must be a GuidedDecodingParams (StructuredOutputsParams), a dict of its fields "
                    f"or None, got {type(value).__name__}")


@dataclass
class SamplingParams:
    """Decoding settings of one request.

    Defaults: `temperature`, `top_p`, `top_k` and the three penalties left as None take the
    model's generation_config.json value, else temperature 1.0, top_p 1.0, top_k 0 (off),
    repetition_penalty 1.0, presence_penalty 0.0, frequency_penalty 0.0 (all neutral).

    Logits processing, in this order (FastDeploy's `get_token_penalty_multi_scores`, then its
    sampler; vLLM's steps are the same, its logit_bias and allowed_token_ids before the penalties):
      1. repetition_penalty r over tokens of the prompt and the output so far: a logit l > 0
         becomes l / r, else l * r (CTRL, Keskar et al. 2019);
      2. frequency and presence penalties over output tokens: l -= frequency_penalty * count
         + presence_penalty * [count > 0] (OpenAI's definition);
      3. logits processors: logit_bias added (l += bias), then the LLM's `logits_processors` in the
         order given (FastDeploy's `LogitBiasLogitsProcessor` reads `logits_processors_args`);
      4. bans (-inf): EOS and stop_token_ids while fewer than min_tokens are generated, bad words,
         and every token outside allowed_token_ids;
      5. division by temperature; temperature 0 = greedy: the argmax of the processed logits;
      6. softmax, min_p, top_k, then top_p on the renormalised remainder; one draw.

    Attributes:
        n: completions per prompt, >= 1. They are independent samples; greedy (temperature 0,
            or below 1e-5) with n > 1 is rejected since the completions would be identical.
        temperature: finite, >= 0; 0 = greedy. A value in (0, 1e-5) is greedy too and is stored
            as 0.0 (vLLM's _SAMPLING_EPS rule), so the sampler never divides by it.
        top_p: in (0, 1]; keep the smallest set of most likely tokens whose probability mass
            reaches top_p (nucleus sampling, Holtzman et al. 2019); the top token is always kept.
        top_k: 0 or -1 = off, else >= 1; keep the k most likely tokens.
        min_p: in [0, 1]; drop tokens whose probability is below min_p x the top probability.
        presence_penalty: in [-2, 2]; subtracted once from the logit of every token already
            generated. Positive values discourage repeating a token at all.
        frequency_penalty: in [-2, 2]; subtracted per occurrence in the output so far.
        repetition_penalty: > 0; 1 = off, > 1 discourages tokens seen in the prompt or output.
        max_tokens: >= 1 generated tokens at most (the prompt is not counted); None = up to
            max_model_len - prompt length. Larger values are clamped to that.
        min_tokens: 0 <= min_tokens <= max_tokens; EOS and stop_token_ids are masked, and stop
            strings not checked, until this many tokens have been generated.
        bad_words: list of non-empty strings never generated. Each word is tokenized as given and
            with a leading space; a one-token word is always masked, the last token of a longer
            word is masked when the output ends with the word's other tokens (vLLM's rule;
            FastDeploy keeps only one-token words).
        bad_words_token_ids: list of token ids always masked (FastDeploy's field).
        seed: int in [0, 922337203685477580] or None; a seeded request draws the same random
            numbers alone or in any batch, in any run (its tokens match up to logit near-ties, see
            docs/offline_inference.md, Determinism). None: drawn from the engine's generator.
        stop: str or list of str; generation ends when the detokenized output contains one.
            The stop string is cut from the text unless `include_stop_str_in_output`.
        stop_token_ids: list of token ids that end generation (kept in `token_ids`; like EOS,
            their text is left out of `text`, vLLM's rule).
        ignore_eos: keep generating after EOS (benchmarks); max_tokens still applies.
        include_stop_str_in_output: keep the matched stop string, or the text of the stop token or
            EOS that ended the request, at the end of `text`.
        logprobs: None, or k >= 0 (-1 = the whole vocabulary): per generated token, the k most
            likely tokens plus the sampled one, as {token_id: Logprob}. At most the LLM's
            `max_logprobs` (20 by default).
        prompt_logprobs: None, or k >= 0 (-1 = vocabulary): the same for every prompt token
            (the first entry is None: nothing precedes it).
        skip_special_tokens: drop special tokens (e.g. `<|im_end|>`) from `text`.
        guided_decoding: a GuidedDecodingParams (or a dict of its fields): the output follows a JSON
            schema, regex, choice or grammar (structured outputs; FastDeploy's field). EOS is allowed
            only where the constraint is complete; `max_tokens` still ends a request early
            (finish_reason "length", the output then a prefix of a valid one).
        structured_outputs: vLLM's name for the same field; give one or the other (both, unless the
            same object, is a ValueError). After construction both hold the same value.
        logit_bias: vLLM's (and OpenAI's) {token id: bias} added to those logits every step (step 3
            above). Keys are ints or strings of ints (JSON), stored as int; values are numbers,
            clamped to [-100, 100]: +100 makes a token all but certain, -100 all but banned.
        allowed_token_ids: vLLM's non-empty list of token ids; every other token is banned (step 4),
            EOS included unless listed (the request then ends at max_tokens or a stop).
        logits_processors_args: FastDeploy's per-request arguments of the LLM's logits processors
            (`LLM(logits_processors=[...])`), a dict each processor reads its own keys from; the
            built-in `LogitBiasLogitsProcessor` reads {"logit_bias": {token id: bias}} (keys and values
            cast to int and float, unclamped). Giving it to an LLM without logits processors is a
            ValueError. See docs/offline_inference.md, "Logits processors".
        Token ids of logit_bias, allowed_token_ids and the built-in processor's logit_bias must lie
        inside the model's vocabulary: checked when the request is added (ValueError naming the prompt).
    """

    n: int = 1
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: float = 0.0
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    max_tokens: Optional[int] = None
    min_tokens: int = 0
    bad_words: Optional[list[str]] = None
    bad_words_token_ids: Optional[list[int]] = None
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    guided_decoding: Optional[GuidedDecodingParams] = None
    structured_outputs: Optional[GuidedDecodingParams] = None
    logit_bias: Optional[dict[int, float]] = None
    allowed_token_ids: Optional[list[int]] = None
    logits_processors_args: Optional[dict] = None
    stop_strings: list[str] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        self._verify_sampling()
        self._verify_penalties()
        self._verify_lengths()
        self._verify_stops()
        self._verify_logprobs()
        self._verify_guided_decoding()
        self._verify_logits_processing()
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            _check_type(name, getattr(self, name), (bool,), "True or False")

    def _verify_sampling(self) -> None:
        _check_type("n", self.n, (int,), f"an int in [1, {MAX_N}]")
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}], got {self.n}: each completion is a request of its own; "
                             "for more samples, send the prompt several times")
        if self.temperature is not None:
            self._verify_temperature()
        if self.top_p is not None:
            _check_number("top_p", self.top_p, lambda p: 0 < p <= 1, "in (0, 1]")
        if self.top_k is not None:
            _check_type("top_k", self.top_k, (int,), "an int: 0 or -1 (off) or >= 1")
            if self.top_k < -1:
                raise ValueError(f"top_k must be 0 or -1 (off) or >= 1, got {self.top_k}")
        _check_number("min_p", self.min_p, lambda p: 0 <= p <= 1, "in [0, 1]")
        if self.seed is not None:
            _check_type("seed", self.seed, (int,), f"an int in [0, {MAX_SEED}]")
            if not 0 <= self.seed <= MAX_SEED:
                raise ValueError(f"seed must be in [0, {MAX_SEED}], got {self.seed}")

    def _verify_temperature(self) -> None:
        """Check temperature; (0, GREEDY_TEMPERATURE_EPS) becomes 0.0 (greedy), then greedy needs n == 1."""
        _check_number("temperature", self.temperature, lambda t: t >= 0, ">= 0 (0 = greedy)")
        given = self.temperature
        if given < GREEDY_TEMPERATURE_EPS:
            self.temperature = 0.0
        if self.temperature == 0 and self.n > 1:
            shown = "0" if given == 0 else f"{given!r} < {GREEDY_TEMPERATURE_EPS}, which is greedy"
            raise ValueError(
                f"n must be 1 with greedy decoding (temperature={shown}), got n={self.n}: the {self.n} "
                f"completions would be identical; set temperature >= {GREEDY_TEMPERATURE_EPS} to sample them"
            )

    def _verify_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) is not None:
                _check_number(name, getattr(self, name), lambda v: -2 <= v <= 2, "in [-2, 2]")
        if self.repetition_penalty is not None:
            _check_number("repetition_penalty", self.repetition_penalty, lambda v: v > 0, "> 0 (1 = off)")
        if self.bad_words is not None:
            words = self.bad_words
            if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) for w in words):
                raise TypeError(f"bad_words must be a list of str, got {words!r}")
            if any(not w.strip() for w in words):
                raise ValueError(f"bad_words must not contain an empty or blank string, got {words!r}")
        if self.bad_words_token_ids is not None:
            _check_token_ids("bad_words_token_ids", self.bad_words_token_ids)

    def _verify_lengths(self) -> None:
        if self.max_tokens is not None:
            _check_type("max_tokens", self.max_tokens, (int,), "an int >= 1")
            if self.max_tokens < 1:
                raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        _check_type("min_tokens", self.min_tokens, (int,), "an int >= 0")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens={self.max_tokens}, got {self.min_tokens}"
            )

    def _verify_stops(self) -> None:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if stop is not None:
            if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
                raise TypeError(f"stop must be a str or a list of str, got {self.stop!r}")
            if any(s == "" for s in stop):
                raise ValueError(f"stop must not contain an empty string, got {self.stop!r}")
        self.stop_strings = list(stop or [])
        if self.stop_token_ids is not None:
            _check_token_ids("stop_token_ids", self.stop_token_ids)

    def _verify_logprobs(self) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check_type(name, value, (int,), "None or an int >= 0 (-1 = the whole vocabulary)")
                if value < -1:
                    raise ValueError(f"{name} must be >= 0, or -1 for the whole vocabulary, got {value}")

    def _verify_guided_decoding(self) -> None:
        guided = _guided("guided_decoding", self.guided_decoding)
        structured = _guided("structured_outputs", self.structured_outputs)
        if guided is not None and structured is not None and guided != structured:
            raise ValueError("guided_decoding and structured_outputs are two names of one field; set one, got "
                             f"guided_decoding={guided!r} and structured_outputs={structured!r}")
        self.guided_decoding = self.structured_outputs = guided if guided is not None else structured

    def _verify_logits_processing(self) -> None:
        if self.logit_bias is not None:
            self.logit_bias = _logit_bias("logit_bias", self.logit_bias)
        if self.allowed_token_ids is not None:
            _check_token_ids("allowed_token_ids", self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids must not be empty: it lists the only tokens the request may "
                                 "generate (None: every token)")
        if self.logits_processors_args is not None and not isinstance(self.logits_processors_args, dict):
            raise TypeError("logits_processors_args must be a dict of the logits processors' arguments, got "
                            f"{type(self.logits_processors_args).__name__}")

    def clone(self, **changes) -> "SamplingParams":
        """A validated copy with `changes` applied; the original is left untouched."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        for key, value in values.items():
            if isinstance(value, (list, tuple)):
                values[key] = list(value)
        values.update(changes)
        return SamplingParams(**values)
