"""SamplingParams: how one request is decoded. Data and validation only, no engine logic.

Field names and ranges follow FastDeploy's `fastdeploy.engine.sampling_params.SamplingParams`
(and vLLM's, whose extra fields `ignore_eos`, `include_stop_str_in_output` and
`skip_special_tokens` are accepted too). Every field is checked in `__post_init__`; a bad value
raises ValueError (or TypeError for a wrong type) naming the field, the value and what is allowed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Union

MAX_SEED = 922337203685477580  # FastDeploy's bound


def _check_type(name: str, value, types: tuple, allowed: str) -> None:
    if isinstance(value, bool) and bool not in types:
        raise TypeError(f"{name} must be {allowed}, got {value!r} (bool)")
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")


@dataclass
class SamplingParams:
    """Decoding settings of one request.

    Defaults: `temperature`, `top_p` and `top_k` left as None take the model's
    generation_config.json value, else 1.0, 1.0 and 0 (off). `temperature=0` means greedy:
    the exact argmax of the logits.

    Attributes:
        n: completions per prompt; only 1 is supported in this version.
        temperature: >= 0; logits are divided by it before softmax; 0 = greedy.
        top_p: in (0, 1]; keep the smallest set of most likely tokens whose probability mass
            reaches top_p (nucleus sampling, Holtzman et al. 2019).
        top_k: 0 or -1 = off, else >= 1; keep the k most likely tokens.
        min_p: in [0, 1]; drop tokens whose probability is below min_p x the top probability.
        Filter order (FastDeploy's sampler and vLLM's): temperature, softmax, min_p, top_k,
        then top_p on the renormalised remainder.
        max_tokens: >= 1 generated tokens at most (the prompt is not counted); None = up to
            max_model_len - prompt length. Larger values are clamped to that.
        min_tokens: 0 <= min_tokens <= max_tokens; EOS and stop_token_ids are masked until this
            many tokens have been generated.
        seed: int in [0, 922337203685477580] or None; a seeded request draws the same tokens
            alone or in any batch.
        stop: str or list of str; generation ends when the detokenized output contains one.
            The stop string is cut from the text unless `include_stop_str_in_output`.
        stop_token_ids: list of token ids that end generation (kept in `token_ids`).
        ignore_eos: keep generating after EOS (benchmarks); max_tokens still applies.
        include_stop_str_in_output: keep the matched stop string at the end of `text`.
        skip_special_tokens: drop special tokens (e.g. `<|im_end|>`) from `text`.
    """

    n: int = 1
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: float = 0.0
    max_tokens: Optional[int] = None
    min_tokens: int = 0
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stop_strings: list[str] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        self._verify_numbers()
        self._verify_stops()

    def _verify_numbers(self) -> None:
        _check_type("n", self.n, (int,), "an int")
        if self.n != 1:
            raise ValueError(f"n must be 1 in this version, got {self.n}")
        if self.temperature is not None:
            _check_type("temperature", self.temperature, (int, float), "a number >= 0")
            if not self.temperature >= 0:
                raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_p is not None:
            _check_type("top_p", self.top_p, (int, float), "a number in (0, 1]")
            if not 0 < self.top_p <= 1:
                raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None:
            _check_type("top_k", self.top_k, (int,), "an int: 0 or -1 (off) or >= 1")
            if self.top_k < -1:
                raise ValueError(f"top_k must be 0 or -1 (off) or >= 1, got {self.top_k}")
        _check_type("min_p", self.min_p, (int, float), "a number in [0, 1]")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
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
        if self.seed is not None:
            _check_type("seed", self.seed, (int,), f"an int in [0, {MAX_SEED}]")
            if not 0 <= self.seed <= MAX_SEED:
                raise ValueError(f"seed must be in [0, {MAX_SEED}], got {self.seed}")

    def _verify_stops(self) -> None:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        if stop is not None:
            if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
                raise TypeError(f"stop must be a str or a list of str, got {self.stop!r}")
            if any(s == "" for s in stop):
                raise ValueError(f"stop must not contain an empty string, got {self.stop!r}")
        self.stop_strings = list(stop or [])
        if self.stop_token_ids is not None:
            ids = self.stop_token_ids
            if not isinstance(ids, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
            ):
                raise TypeError(f"stop_token_ids must be a list of ints >= 0, got {ids!r}")

    def clone(self, **changes) -> "SamplingParams":
        """A validated copy with `changes` applied; the original is left untouched."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        for key in ("stop", "stop_token_ids"):
            if isinstance(values[key], list):
                values[key] = list(values[key])
        values.update(changes)
        return SamplingParams(**values)
