"""StructuredOutputManager: the engine's side of structured outputs (vLLM v1's split).

- `validate` (when a request is added, before anything is queued): the request's constraint as a
  GrammarSpec (structured_output/grammar.py), compiled by the backend into the cache, so a schema,
  regex or grammar that does not compile is a ValueError naming the prompt and the fault. The cache
  is keyed by the spec (one manager serves one tokenizer), LRU-bounded; a repeated constraint costs a
  dictionary lookup and a copy of the template matcher. Compilation happens on the thread that adds
  the request, never in the step loop.
- `add_requests` / `remove`: one matcher per completion (n > 1: n matchers), at the grammar's start.
- `grammar_bitmask` (each step, after scheduling): the packed masks of the constrained requests that
  sample in this step, filled on the manager's thread while the step's forward runs; the model
  runner waits for them just before sampling (`GrammarBitmask`, engine/sched/output.py). A request
  verifying drafts (speculative decoding) gets a mask per verified row: its matcher advances through
  the drafts the grammar allows, a mask at each, and is rolled back.
- `accept_tokens` (after the step): each sampled token advances its request's matcher.

The matchers live here, not in the runner: a preempted request keeps its matcher (its generated
tokens stay), and under tensor parallelism the masks travel with the step to the rank that samples.
With a reasoning parser, a request is unconstrained until its thinking ends (reasoning_end.py).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional, Union

import numpy as np

from fastdeploy.engine.sampling_params import GuidedDecodingParams, SamplingParams
from fastdeploy.engine.sched.output import GrammarBitmask
from fastdeploy.structured_output.grammar import GrammarSpec, grammar_spec
from fastdeploy.structured_output.reasoning_end import TAIL_TOKENS, ReasoningEnd

CACHE_SIZE = 1024  # compiled grammars kept (each a template matcher: its lexer and parser tables)


@dataclass
class RequestGrammar:
    """One completion's matcher and whether its thinking (if any) has ended."""

    matcher: object
    reasoning_ended: bool = True
    tail: list = field(default_factory=list)  # the last generated tokens while thinking


class StructuredOutputManager:
    """Compiles, caches and advances the grammars of one engine's constrained requests.

    Args:
        backend_name: `LLM(guided_decoding_backend=)`: "auto", "guidance", "xgrammar" or "off".
        tokenizer: the engine's tokenizer.
        vocab_size: the model's vocabulary (the width of a mask row, in tokens).
        eos_token_ids: the ids a grammar allows where it is complete.
        disable_any_whitespace: `LLM(guided_decoding_disable_any_whitespace=)`.
        reasoning: True when a reasoning parser is set (constraints start after the thinking).
    """

    def __init__(self, backend_name: str, tokenizer, vocab_size: int, eos_token_ids: frozenset,
                 disable_any_whitespace: bool = False, reasoning: bool = False):
        self.backend_name = backend_name
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.disable_any_whitespace = disable_any_whitespace
        self.reasoning_end = ReasoningEnd(tokenizer) if reasoning else None
        self.requests: dict[str, RequestGrammar] = {}
        self._backend = None
        self._cache: OrderedDict[GrammarSpec, object] = OrderedDict()
        self._lock = threading.Lock()  # the backend's construction and the cache, for callers on other threads
        self._mask_thread: Optional[ThreadPoolExecutor] = None

    @property
    def backend(self):
        """The backend, built on first use (building llguidance's tokenizer takes ~0.3 s)."""
        with self._lock:
            if self._backend is None:
                from fastdeploy.structured_output.backends import make_backend

                self._backend = make_backend(self.backend_name, self.tokenizer, self.vocab_size, self.eos_token_ids)
            return self._backend

    # ---- requests -------------------------------------------------------------------------------
    def spec(self, params: SamplingParams) -> Optional[GrammarSpec]:
        """The request's GrammarSpec, or None when it has no constraint (ValueError on a bad schema text)."""
        return grammar_spec(params.guided_decoding, self.disable_any_whitespace)

    def validate(self, params: SamplingParams, index: Optional[int] = None) -> None:
        """Compile the request's constraint (into the cache); ValueError naming prompt `index` and the fault."""
        where = "" if index is None else f"prompt {index}: "
        try:
            spec = self.spec(params)
        except ValueError as error:
            raise ValueError(f"{where}{error}") from None
        if spec is None:
            return
        if self.backend_name == "off":
            raise ValueError(f"{where}{spec.describe()} was given, but the LLM was made with "
                             "guided_decoding_backend='off'; use 'auto' (llguidance) for structured outputs")
        try:
            self.compile(spec)
        except ValueError as error:
            raise ValueError(f"{where}{spec.describe()} does not compile ({self.backend.name}): {error}") from None

    def compile(self, spec: Union[GrammarSpec, GuidedDecodingParams]):
        """The compiled grammar of a spec (or of GuidedDecodingParams), from the cache or compiled now
        (ValueError when it does not compile)."""
        if isinstance(spec, GuidedDecodingParams):
            spec = grammar_spec(spec, self.disable_any_whitespace)
        with self._lock:
            compiled = self._cache.get(spec)
            if compiled is not None:
                self._cache.move_to_end(spec)
                return compiled
        compiled = self.backend.compile(spec)  # outside the lock: long grammars take a while
        with self._lock:
            self._cache[spec] = compiled
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def add_requests(self, req_ids: list[str], params: SamplingParams, prompt_token_ids: list[int]) -> None:
        """Give a queued prompt's completions (its `n` request ids) a matcher each (validate() ran when
        the prompt was added); the spec, the compiled grammar and the thinking state of the prompt are
        found once for all of them."""
        spec = self.spec(params)
        if spec is None:
            return
        compiled = self.compile(spec)
        ended = self.reasoning_end is None or self.reasoning_end.ended_in_prompt(prompt_token_ids)
        for req_id in req_ids:
            self.requests[req_id] = RequestGrammar(self.backend.matcher(compiled), ended)

    def remove(self, req_ids) -> None:
        for req_id in req_ids:
            self.requests.pop(req_id, None)

    # ---- steps --------------------------------------------------------------------------------
    def grammar_bitmask(self, sampling_req_ids: list[str],
                        drafts: Optional[dict[str, list[int]]] = None) -> Optional[GrammarBitmask]:
        """Masks for the constrained requests among `sampling_req_ids` (the step's requests that sample),
        one per verified row of those with `drafts` (req_id -> the drafts it verifies), filled on the
        manager's thread; None when none is constrained now."""
        drafts = drafts or {}
        plain, drafted = [], []  # (req_id, grammar) without drafts; (req_id, grammar, drafts)
        for req_id in sampling_req_ids:
            grammar = self.requests.get(req_id)
            if grammar is not None and drafts.get(req_id):
                drafted.append((req_id, grammar, drafts[req_id]))
            elif grammar is not None and grammar.reasoning_ended:
                plain.append((req_id, grammar))
        rows = [(req_id, 0) for req_id, _ in plain] + [(req_id, j) for req_id, _, d in drafted
                                                       for j in range(len(d) + 1)]
        if not rows:
            return None
        bitmask = np.empty((len(rows), (self.vocab_size + 31) // 32), dtype=np.int32)  # [rows, words]
        if self._mask_thread is None:
            self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="fd-grammar-mask")
        future = self._mask_thread.submit(self._fill, [g.matcher for _, g in plain], drafted, bitmask)
        return GrammarBitmask([req_id for req_id, _ in rows], future, [j for _, j in rows])

    def _fill(self, matchers: list, drafted: list, bitmask: np.ndarray) -> np.ndarray:
        """The rows of `matchers` (one each, first), then each drafted request's rows."""
        if matchers:
            self.backend.fill_bitmask(matchers, bitmask[: len(matchers)])
        row = len(matchers)
        for _, grammar, step_drafts in drafted:
            self._fill_drafted(grammar, step_drafts, bitmask[row : row + len(step_drafts) + 1])
            row += len(step_drafts) + 1
        return bitmask

    def _fill_drafted(self, grammar: RequestGrammar, drafts: list[int], rows: np.ndarray) -> None:
        """rows [len(drafts) + 1, words] := the mask after each prefix of `drafts`, as accept_tokens would
        leave the matcher (thinking rows unconstrained; the token closing the thinking not fed). From a
        draft the grammar forbids on, no row can be used (that draft is rejected), so they allow all.
        The matcher is rolled back to where it was."""
        ended, tail, fed, usable = grammar.reasoning_ended, list(grammar.tail), 0, True
        for j in range(len(drafts) + 1):
            if ended and usable:
                self.backend.fill_bitmask([grammar.matcher], rows[j : j + 1])
            else:
                rows[j] = -1
            if j == len(drafts) or not usable:
                continue
            token = drafts[j]
            if not ended:
                tail, ended = self._thinking_step(tail, token)
            elif (rows[j, token >> 5] >> (token & 31)) & 1 and self.backend.accept_token(grammar.matcher, token):
                fed += 1
            else:
                usable = False
        if fed:
            self.backend.rollback(grammar.matcher, fed)

    def _thinking_step(self, tail: list, token_id: int) -> tuple[list, bool]:
        """A thinking request's last TAIL_TOKENS tokens after `token_id`, and whether it closed the thinking."""
        tail = (tail + [token_id])[-TAIL_TOKENS:]
        return tail, self.reasoning_end.closes(tail)

    def accept_tokens(self, sampled_token_ids: dict[str, list[int]]) -> dict[str, str]:
        """Advance each constrained request by the tokens it gained in the step (accepted drafts and
        one sampled token under speculative decoding); returns {req_id: error} for the requests whose
        grammar rejected a token (they cannot go on)."""
        failed = {}
        if not self.requests:
            return failed
        for req_id, token_ids in sampled_token_ids.items():
            grammar = self.requests.get(req_id)
            for token_id in token_ids if grammar is not None else ():
                if not grammar.reasoning_ended:  # thinking: unconstrained; the closing token is not fed
                    grammar.tail, grammar.reasoning_ended = self._thinking_step(grammar.tail, token_id)
                elif not self.backend.accept_token(grammar.matcher, token_id):
                    failed[req_id] = (f"token {token_id} is not allowed by the request's guided_decoding "
                                      "constraint (no token was: e.g. min_tokens banned EOS where the grammar "
                                      "allows only EOS)")
                    break
        return failed

    def shutdown(self) -> None:
        if self._mask_thread is not None:
            self._mask_thread.shutdown(wait=True)
            self._mask_thread = None
