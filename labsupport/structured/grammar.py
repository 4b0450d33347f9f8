"""The compiled constraint a sampler or engine uses: :class:`StructuredOutput`.

Interface (all a decode loop needs)::

    g = compile_structured_output({"json": schema}, tokenizer)
    state = g.initial_state()
    mask = g.allowed_token_mask(state)            # (vocab,) bool — cached per state
    token = sample(apply_structured_mask(logits, mask))
    state = g.advance(state, token)                # a table look-up
    g.is_accepting(state)                          # EOS is allowed exactly here

A request spec is a dict: ``{"json": schema}`` (or a bare JSON Schema dict),
``{"regex": pattern}``, ``{"choice": [text, ...]}``, or ``{"grammar": ebnf_text}`` (a context-free
grammar with recursion, :mod:`.pushdown`; vLLM's ``grammar`` option); JSON specs may add ``"whitespace": k``
(0..8, default 0) and ``"any_order": bool`` (default True). Compiled grammars are cached
per (tokenizer, spec), so a thousand requests with one schema compile it once.

**Valid at max_tokens** (``"fit_max_tokens": True``, any kind): an engine cuts a request at
``max_tokens`` wherever it is, so a sampled JSON object can end inside a string. From every
state the fewest tokens to an accepting state, :meth:`StructuredOutput.tokens_to_finish`, is
known (a breadth-first search over the token transitions, backwards from the accepting states).
With the option on, a step with ``tokens_left`` allows only the tokens after which a completion
(and its EOS) still fits, so the output is complete whenever ``max_tokens`` is at least the
shortest completion. Without it the mask is the grammar's alone.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict

import numpy as np
import torch

from ..validation import check_bool, check_int, check_type
from .automaton import DFA, compile_tree
from .constraint import TokenConstraint
from .json_schema import schema_to_rules, schema_to_tree
from .pushdown import PushdownOutput, check_grammar
from .regex import MAX_NESTING, Alt, literal, nesting_error, parse_regex
from .token_index import TokenIndex, token_bytes

SPEC_KINDS = ("json", "regex", "choice", "grammar")
JSON_OPTIONS = ("whitespace", "any_order")
COMMON_OPTIONS = ("fit_max_tokens",)
MAX_WHITESPACE = 8
CACHE_SIZE = 32


def normalize_spec(spec) -> tuple[str, object, dict]:
    """As :func:`_normalize_spec`; structure too deep for any check below is a ValueError, never a
    ``RecursionError``."""
    try:
        return _normalize_spec(spec)
    except RecursionError:
        raise nesting_error("its structure") from None


def _normalize_spec(spec) -> tuple[str, object, dict]:
    """Check a structured-output spec and return ``(kind, payload, options)``.

    Raises:
        TypeError: ``spec`` is not a dict, a regex is not a str, choices are not strings.
        ValueError: no or several kinds, unknown option keys, an empty choice list, or a
            schema / regex outside the supported subset (the message names the keyword).
    """
    check_type("structured_output", spec, dict)
    kinds = [k for k in SPEC_KINDS if k in spec]
    if not kinds:                                   # a bare JSON Schema
        spec = {"json": spec}
        kinds = ["json"]
    if len(kinds) > 1:
        raise ValueError(f"structured_output must name exactly one of {list(SPEC_KINDS)}, got {kinds}")
    kind = kinds[0]
    allowed_keys = [kind, *(JSON_OPTIONS if kind == "json" else ()), *COMMON_OPTIONS]
    extra = set(spec) - set(allowed_keys)
    if extra:
        raise ValueError(f"structured_output key {min(extra)!r} is not supported with {kind!r} "
                         f"(allowed: {allowed_keys})")
    payload = spec[kind]
    options: dict = {}
    if "fit_max_tokens" in spec and check_bool("structured_output['fit_max_tokens']", spec["fit_max_tokens"]):
        options["fit_max_tokens"] = True
    if kind == "json":
        check_type("structured_output['json']", payload, dict)
        check_json_depth(payload)
        options["whitespace"] = check_int("structured_output['whitespace']", spec.get("whitespace", 0), 0, MAX_WHITESPACE)
        options["any_order"] = check_bool("structured_output['any_order']", spec.get("any_order", True))
        schema_to_rules(payload, whitespace=options["whitespace"], any_order=options["any_order"])
    elif kind == "regex":
        parse_regex(payload)
    elif kind == "grammar":
        check_type("structured_output['grammar']", payload, str)
        check_grammar(payload)                                      # raises early, naming the line
    else:
        if not isinstance(payload, (list, tuple)) or not payload:
            raise ValueError(f"structured_output['choice'] must be a non-empty list of strings, got {payload!r}")
        for c in payload:
            check_type("structured_output['choice'] items", c, str)
        if any(c == "" for c in payload):
            raise ValueError("structured_output['choice'] items must be non-empty strings, got ''")
        payload = list(payload)
    return kind, payload, options


MAX_JSON_NESTING = 2 * MAX_NESTING
"""Most objects and arrays nested in a JSON Schema (a schema level is often two: ``{"items": {…}}``)."""


def check_json_depth(schema) -> None:
    """Refuse a schema whose objects and arrays nest deeper than :data:`MAX_JSON_NESTING` (measured
    without recursion, before anything else walks it).

    Raises:
        ValueError: "structured_output: JSON Schema objects and arrays nesting deeper than N levels…".
    """
    todo = [(schema, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > MAX_JSON_NESTING:
            raise nesting_error("JSON Schema objects and arrays", MAX_JSON_NESTING)
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        todo.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def spec_tree(kind: str, payload, options: dict):
    """The grammar tree of a normalised spec."""
    if kind == "json":
        return schema_to_tree(payload, **{k: v for k, v in options.items() if k in JSON_OPTIONS})
    if kind == "regex":
        return parse_regex(payload)
    return Alt(tuple(literal(c) for c in payload))


class StructuredOutput(TokenConstraint):
    """A grammar compiled for one tokenizer: masks and transitions over token ids.

    States are DFA state numbers (ints, start 0). See the module docstring for the loop.
    """

    def __init__(self, dfa: DFA, index: TokenIndex, key: str, compile_seconds: float,
                 fit_max_tokens: bool = False) -> None:
        self.dfa, self.index, self.key, self.compile_seconds = dfa, index, key, compile_seconds
        self.fit_max_tokens = fit_max_tokens
        self._dist: np.ndarray | None = None

    @property
    def num_states(self) -> int:
        return self.dfa.num_states

    @property
    def vocab_size(self) -> int:
        return self.index.vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self.index.eos_token_id

    def initial_state(self) -> int:
        return 0

    def _check_state(self, state) -> int:
        return check_int("state", state, 0, self.num_states - 1)

    def _grammar_mask(self, state: int) -> torch.Tensor:
        return self.index.mask(state)

    def _token_reach(self, state: int) -> np.ndarray:
        after = self.index.next_rows(state)                          # (vocab,) next state or -1
        return np.where(after >= 0, self.tokens_to_finish_all()[np.maximum(after, 0)], np.inf)

    def tokens_to_finish_all(self) -> np.ndarray:
        """``(num_states,)`` the fewest tokens from each state to an accepting one (EOS not counted;
        ``inf`` where no token path reaches one)."""
        if self._dist is None:
            self.index.warm_up(max_states=self.num_states)          # every row: a search over all states
            n = self.num_states
            preds: list[list[int]] = [[] for _ in range(n)]
            for s in range(n):
                for t in np.unique(self.index.next_rows(s)):
                    if t >= 0:
                        preds[int(t)].append(s)
            dist = np.full(n, np.inf)
            frontier = [s for s in range(n) if self.dfa.accepting[s]]
            dist[frontier] = 0
            d = 0
            while frontier:                                          # BFS backwards from the accepting states
                d += 1
                nxt = []
                for t in frontier:
                    for s in preds[t]:
                        if dist[s] == np.inf:
                            dist[s] = d
                            nxt.append(s)
                frontier = nxt
            self._dist = dist
        return self._dist

    def tokens_to_finish(self, state: int) -> float:
        """The fewest tokens from ``state`` to a complete output (EOS not counted)."""
        return float(self.tokens_to_finish_all()[self._check_state(state)])

    def is_accepting(self, state: int) -> bool:
        return bool(self.dfa.accepting[self._check_state(state)])

    def _next(self, state: int, token_id: int) -> int:
        return self.index.next_state(state, token_id)

    def matches(self, text: str) -> bool:
        """True when the whole ``text`` is in the grammar's language (character level)."""
        return self.dfa.matches(text)


_CACHE: OrderedDict = OrderedDict()
_TOKENS: dict[int, tuple[object, int, list]] = {}


def _tokens_of(tokenizer, vocab_size: int) -> list:
    hit = _TOKENS.get(id(tokenizer))
    if hit is None or hit[0] is not tokenizer or hit[1] != vocab_size:
        hit = (tokenizer, vocab_size, token_bytes(tokenizer, vocab_size))
        _TOKENS[id(tokenizer)] = hit
    return hit[2]


def compile_structured_output(spec, tokenizer, *, vocab_size: int | None = None,
                              eos_token_id: int | None = None,
                              device: torch.device | str = "cpu") -> StructuredOutput:
    """Compile ``spec`` for ``tokenizer`` (cached per tokenizer, vocabulary size, EOS, device, spec).

    Args:
        spec: ``{"json": schema}`` / bare schema, ``{"regex": ...}`` or ``{"choice": [...]}``.
        tokenizer: a Hugging Face byte-level BPE tokenizer.
        vocab_size: width of the logits (default ``len(tokenizer)``).
        eos_token_id: default ``tokenizer.eos_token_id``.
        device: where the masks live.

    Raises:
        TypeError / ValueError: see :func:`normalize_spec`; ValueError also when the grammar
            matches nothing or is too large.
    """
    try:
        return _compile(spec, tokenizer, vocab_size, eos_token_id, device)
    except RecursionError:
        raise nesting_error("its structure") from None


def _compile(spec, tokenizer, vocab_size, eos_token_id, device) -> StructuredOutput:
    kind, payload, options = normalize_spec(spec)
    vocab = len(tokenizer) if vocab_size is None else check_int("vocab_size", vocab_size, 1)
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    key = json.dumps([kind, payload, options], sort_keys=True, ensure_ascii=False)
    cache_key = (id(tokenizer), vocab, eos, str(torch.device(device)), key)
    hit = _CACHE.get(cache_key)
    if hit is not None and hit[0] is tokenizer:
        _CACHE.move_to_end(cache_key)
        return hit[1]
    start = time.perf_counter()                     # compile time: the schema's rules, the DFA, the token index
    rules = None
    if kind == "json":
        rules = schema_to_rules(payload, **{k: v for k, v in options.items() if k in JSON_OPTIONS})
    if kind == "grammar" or (rules is not None and len(rules[0]) > 1):   # recursion: the pushdown path
        compiled = PushdownOutput(payload if kind == "grammar" else rules, _tokens_of(tokenizer, vocab), eos,
                                  device, key, fit_max_tokens=options.get("fit_max_tokens", False))
    else:
        tree = rules[1]["root"] if rules is not None else spec_tree(kind, payload, options)   # compiled once
        dfa = compile_tree(tree)
        index = TokenIndex(dfa, _tokens_of(tokenizer, vocab), eos, device)
        index.warm_up()
        compiled = StructuredOutput(dfa, index, key, time.perf_counter() - start,
                                    fit_max_tokens=options.get("fit_max_tokens", False))
    _CACHE[cache_key] = (tokenizer, compiled)
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return compiled


def for_model(spec, lm) -> StructuredOutput:
    """:func:`compile_structured_output` for a :class:`~labsupport.models.LoadedModel`."""
    return compile_structured_output(spec, lm.tokenizer, vocab_size=lm.model.config.vocab_size,
                                     eos_token_id=lm.eos_token_id, device=lm.device)
