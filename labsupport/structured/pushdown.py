"""A context-free grammar over tokens: one automaton per recursive rule and a stack of them.

A finite automaton cannot check that brackets balance at any depth; a **pushdown** matcher can.
:mod:`.ebnf` leaves a byte DFA per rule that needs a stack, where a reference to such a rule is
a symbol byte. The matcher's state is a set of **stacks** of frames ``(rule, DFA state)``; the
top frame reads the text:

* a byte the top rule's DFA reads moves its state;
* a symbol the top rule's DFA can read **calls** that rule: the top frame moves past the symbol
  (its return point) and a new frame ``(rule, 0)`` is pushed;
* an accepting top frame may **return**: it is popped and its caller goes on.

Several stacks at once keep the grammar's ambiguities exact (a set of stacks, like Earley's
items; left recursion is refused, and more than :data:`MAX_STACKS` parses of one text at once
is refused as too ambiguous). A stack holds at most :data:`MAX_STACK` frames, and a stack that
could no longer finish within them is dropped as soon as it appears — so no state is a dead end:
whatever has been generated can still be completed.

**Token masks** (the idea behind XGrammar's adaptive token mask cache, Dong et al., 2024): most
tokens are decided by the top frame alone — a token whose bytes the top rule's DFA reads without
calling or returning is allowed whatever lies below. Those are one vectorised look-up per
``(rule, state)``, cached (:class:`~.token_index.TokenIndex`). Only the other tokens, and only
those whose first byte can start somewhere, are walked through the stack; and each whole
stack-set's mask is cached too, so a state seen again costs a dictionary look-up.

**The budget** (``fit_max_tokens``): the fewest bytes that complete a stack is the sum, over its
frames, of each frame's distance to its rule's end, where reading a byte costs 1 and calling a
rule costs that rule's shortest complete text (:meth:`PushdownOutput.rule_lengths`, a fixpoint:
a rule's length depends on the rules it calls; computed per number of frames left, so that a
frame near :data:`MAX_STACK` counts only the completions that fit below the limit). Every
byte is a token of a byte-level BPE vocabulary, so this is a number of one-byte tokens: an upper
bound on the tokens a completion needs, and exact for the completions made of one-byte tokens — enough for the guarantee
"complete whenever ``max_tokens`` is at least the distance".

Interface: the same as :class:`~.grammar.StructuredOutput` (integer states, ``allowed_token_mask``,
``advance``, ``is_accepting``, ``matches``, ``tokens_to_finish``), so ``generate``, ``LLMEngine``
and the speculative engine take either.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import torch

from ..validation import check_int
from .automaton import DFA, EmptyLanguageError, compile_tree
from .constraint import TokenConstraint
from .ebnf import SYMBOL_BYTES, lower
from .token_index import TokenIndex

MAX_STACK = 64          # frames: deeper nesting than this is refused (the output stays valid: it must close)
MAX_STACKS = 1024       # stacks in one state: more parses of one text than this is refused as too ambiguous
TEXT_BYTES = SYMBOL_BYTES[0]          # bytes below this are text; the rest are rule symbols


def check_grammar(text: str) -> None:
    """Parse and check ``text`` (syntax, undefined rules, left recursion) without a tokenizer.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: what :func:`~.ebnf.lower` raises, or a left-recursive rule.
    """
    compile_rules(text)


def compile_rules(text: str) -> tuple[tuple[str, ...], tuple[DFA, ...]]:
    """The rule names (root first) and each rule's byte DFA of EBNF ``text``, checked for left
    recursion. Cached per text: ``SamplingParams`` checks a grammar when it is made and the engine
    compiles it for its tokenizer later, and both need the same automata (the DFAs are read-only).

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: what :func:`~.ebnf.lower` raises, or a left-recursive rule.
    """
    if not isinstance(text, str):
        lower(text)                                   # raises the TypeError that names the parameter
    return _compile_rules(text)


@functools.lru_cache(maxsize=32)
def _compile_rules(text: str) -> tuple[tuple[str, ...], tuple[DFA, ...]]:
    symbols, trees = lower(text)
    dfas = tuple(compile_tree(trees[name]) for name in symbols)
    _left_recursion(list(symbols), list(dfas))
    return tuple(symbols), dfas


def _left_recursion(symbols: list[str], dfas: list[DFA]) -> None:
    """A rule that can call itself before reading a byte would push forever: refuse it."""
    code = {SYMBOL_BYTES[i]: i for i in range(len(symbols))}

    def before_text(r: int, nullable: set[int]) -> tuple[set[int], bool]:
        """The rules ``r`` can call before reading a byte, and whether it can end there too."""
        dfa = dfas[r]
        seen, todo, out = {0}, [0], set()
        while todo:                                   # states reachable by calls of nullable rules
            q = todo.pop()
            for byte, s in code.items():
                t = int(dfa.transitions[q, byte])
                if t >= 0:
                    out.add(s)
                    if s in nullable and t not in seen:
                        seen.add(t)
                        todo.append(t)
        return out, any(dfa.accepting[q] for q in seen)

    nullable: set[int] = set()                       # rules that can end without text (perhaps via a call)
    while True:
        more = {r for r in range(len(dfas)) if before_text(r, nullable)[1]}
        if more <= nullable:
            break
        nullable |= more
    calls = {r: before_text(r, nullable)[0] for r in range(len(dfas))}
    for r, first in calls.items():
        seen, todo = set(), list(first)
        while todo:
            s = todo.pop()
            if s == r:
                raise ValueError(f"grammar rule {symbols[r]!r} is left-recursive (it can reach itself before "
                                 "reading any text); rewrite it with repetition, e.g. a ::= b (\"+\" b)*")
            if s not in seen:
                seen.add(s)
                todo.extend(calls[s])


class PushdownOutput(TokenConstraint):
    """A grammar with recursion, compiled for one tokenizer (see the module docstring)."""

    def __init__(self, grammar, tokens: list[bytes | None], eos_token_id: int | None,
                 device: torch.device | str = "cpu", key: str = "", fit_max_tokens: bool = False) -> None:
        """``grammar``: EBNF text (:func:`~.ebnf.lower`), or ``(rule names, trees)`` with the root first
        (:func:`~.json_schema.schema_to_rules`), a reference to rule ``i`` being ``RawByte(SYMBOL_BYTES[i])``."""
        start = time.perf_counter()
        if isinstance(grammar, str):
            symbols, dfas = compile_rules(grammar)
            self.symbols, self.dfas = list(symbols), list(dfas)
        else:
            self.symbols, trees = grammar
            self.dfas = [compile_tree(trees[name]) for name in self.symbols]
            _left_recursion(self.symbols, self.dfas)
        self.code = {SYMBOL_BYTES[i]: i for i in range(len(self.symbols))}
        text_only = []                                # the same DFAs reading text bytes only
        for dfa in self.dfas:
            table = dfa.transitions.copy()
            table[:, TEXT_BYTES:] = -1
            text_only.append(DFA(table, dfa.accepting))
        self._local = [TokenIndex(d, tokens, None, device) for d in text_only]
        self.tokens = tokens
        self.vocab_size = len(tokens)
        self.eos_token_id = eos_token_id
        self.device = torch.device(device)
        self.key = key
        self.fit_max_tokens = fit_max_tokens
        self._levels: list[list[np.ndarray]] = self._depth_levels(tokens)
        if not np.isfinite(self._levels[-1][0][0]):
            raise EmptyLanguageError("the grammar matches no string at all (every derivation of the root rule "
                             f"recurses forever or nests deeper than MAX_STACK={MAX_STACK} frames)")
        self._by_first: dict[int, np.ndarray] = {}
        firsts = np.array([t[0] if t else -1 for t in tokens])
        for b in range(256):
            self._by_first[b] = np.nonzero(firsts == b)[0]
        self._states: list[frozenset] = []
        self._ids: dict[frozenset, int] = {}
        self._masks: dict[int, torch.Tensor] = {}
        self._reach: dict[int, np.ndarray] = {}
        self._next_ids: dict[tuple[int, int], int] = {}
        self.initial = self._intern(frozenset({((0, 0),)}))
        self.compile_seconds = time.perf_counter() - start

    # ------------------------------------------------------------------ the stack machine
    def expand(self, stacks) -> set[tuple]:
        """Every stack reachable from ``stacks`` by calls and returns alone (no text read): the
        stacks whose top frame may read the next byte. A stack is a tuple of ``(rule, DFA state)``
        frames, the top last."""
        out, todo = set(), list(stacks)
        while todo:
            stack = todo.pop()
            if stack in out:
                continue
            out.add(stack)
            if len(out) > MAX_STACKS:
                raise ValueError(f"the grammar is too ambiguous to match: more than MAX_STACKS={MAX_STACKS} "
                                 "stacks at once (the text so far has that many parses, or prefixes of "
                                 "parses, e.g. a bracket that may open either of two rules at every depth); "
                                 "rewrite the rules so that alternatives differ in their first bytes")
            r, q = stack[-1]
            dfa = self.dfas[r]
            if len(stack) < MAX_STACK:
                for byte, s in self.code.items():
                    t = int(dfa.transitions[q, byte])
                    if t >= 0:
                        todo.append(stack[:-1] + ((r, t), (s, 0)))
            if dfa.accepting[q] and len(stack) > 1:
                todo.append(stack[:-1])
        return out

    def step(self, stacks, byte: int) -> frozenset:
        """The stacks after reading one text ``byte`` (empty: the byte is not allowed). A stack that
        can no longer be completed within :data:`MAX_STACK` frames is dropped: no state is a dead end."""
        if byte >= TEXT_BYTES:
            return frozenset()
        out = set()
        for stack in self.expand(stacks):
            r, q = stack[-1]
            t = int(self.dfas[r].transitions[q, byte])
            if t >= 0:
                after = stack[:-1] + ((r, t),)
                if np.isfinite(self._stack_distance(after)):
                    out.add(after)
        return frozenset(out)

    def _accepts(self, stacks) -> bool:
        return any(len(s) == 1 and self.dfas[0].accepting[s[0][1]] for s in self.expand(stacks))

    def _intern(self, stacks: frozenset) -> int:
        if stacks not in self._ids:
            self._ids[stacks] = len(self._states)
            self._states.append(stacks)
        return self._ids[stacks]

    def _walk(self, stacks, data: bytes) -> frozenset:
        for b in data:
            stacks = self.step(stacks, b)
            if not stacks:
                break
        return stacks

    # ------------------------------------------------------------------ the StructuredOutput interface
    @property
    def num_states(self) -> int:
        return len(self._states)

    def initial_state(self) -> int:
        return self.initial

    def _check_state(self, state) -> int:
        return check_int("state", state, 0, self.num_states - 1)

    def frames(self, state: int) -> frozenset:
        """The stacks of ``state`` as they are matched: tuples of ``(rule, DFA state)``, the top last."""
        return self._states[self._check_state(state)]

    def stacks(self, state: int) -> list[tuple[str, ...]]:
        """The stacks of ``state`` as rule names, bottom first (e.g. ``('root', 'factor', 'factor')``)."""
        return sorted(tuple(self.symbols[r] for r, _ in stack) for stack in self._states[self._check_state(state)])

    def _grammar_mask(self, state: int) -> torch.Tensor:
        """``(vocab,)`` bool: the tokens after which the text can still be completed; EOS when complete."""
        if state not in self._masks:
            mask = np.isfinite(self._token_reach(state))
            if self.eos_token_id is not None:
                mask[self.eos_token_id] = self._accepts(self._states[state])
            self._masks[state] = torch.from_numpy(mask).to(self.device)
        return self._masks[state]

    def is_accepting(self, state: int) -> bool:
        return self._accepts(self._states[self._check_state(state)])

    def _next(self, state: int, token_id: int) -> int:
        key = (state, token_id)
        if key not in self._next_ids:
            data = self.tokens[token_id]
            after = self._walk(self._states[state], data) if data else frozenset()
            self._next_ids[key] = self._intern(after) if after else -1
        return self._next_ids[key]

    def matches(self, text: str) -> bool:
        """True when the whole ``text`` is in the grammar's language.

        Raises:
            ValueError: more than :data:`MAX_STACKS` stacks at once on the way (too ambiguous)."""
        stacks = self._walk(self._states[self.initial], text.encode("utf-8"))
        return bool(stacks) and self._accepts(stacks)

    # ------------------------------------------------------------------ the budget (fit_max_tokens)
    def rule_lengths(self) -> list[float]:
        """The shortest complete text of each rule, in one-byte tokens (``inf``: none)."""
        return [float(d[0]) for d in self._levels[-1]]

    def _depth_levels(self, tokens) -> list[list[np.ndarray]]:
        """The fewest one-byte tokens from each DFA state to its rule's end, **by the frames left**.

        ``levels[k - 1][r][q]``: from state ``q`` of rule ``r`` when this frame and those it pushes
        may use ``k`` frames. With one frame no call is possible; with ``k`` a call of rule ``s``
        costs ``levels[k - 2][s][0]`` (its shortest text within the ``k - 1`` frames left). Once the
        rules' lengths stop changing from one ``k`` to the next, every deeper level is the same, so
        the list stops there (its last entry holds for every ``k`` beyond it, up to ``MAX_STACK``).
        A frame at depth ``j`` (0 at the bottom) has ``MAX_STACK - j`` frames; a stack whose frames
        cannot all finish within theirs is a dead end, which :meth:`step` drops.
        """
        one_byte = np.zeros(TEXT_BYTES, dtype=bool)
        for t in tokens:
            if t is not None and len(t) == 1 and t[0] < TEXT_BYTES:
                one_byte[t[0]] = True
        text_cols = np.nonzero(one_byte)[0]
        levels: list[list[np.ndarray]] = []
        length = [np.inf] * len(self.dfas)           # one frame: a call cannot be made
        dist = [np.where(d.accepting, 0.0, np.inf) for d in self.dfas]
        for _ in range(MAX_STACK):
            new_level = []
            for r, dfa in enumerate(self.dfas):
                d = dist[r]                           # the level below is an upper bound: relax from it
                while True:                           # Bellman-Ford in one rule's DFA, vectorised over states
                    nxt = dfa.transitions[:, text_cols]
                    best = np.where(nxt >= 0, d[np.maximum(nxt, 0)], np.inf).min(axis=1, initial=np.inf) + 1
                    for byte, callee in self.code.items():
                        col = dfa.transitions[:, byte]
                        best = np.minimum(best, np.where(col >= 0, d[np.maximum(col, 0)], np.inf) + length[callee])
                    new = np.minimum(d, best)
                    if np.array_equal(new, d):
                        break
                    d = new
                new_level.append(d)
            levels.append(new_level)
            new_length = [float(d[0]) for d in new_level]
            if new_length == length:
                break
            length, dist = new_length, new_level
        return levels

    def _frame_distances(self, depth: int) -> list[np.ndarray]:
        """Per rule, the distances of a frame at ``depth`` (0: the bottom of the stack)."""
        return self._levels[min(MAX_STACK - depth, len(self._levels)) - 1]

    def _stack_distance(self, stack) -> float:
        return sum(float(self._frame_distances(j)[r][q]) for j, (r, q) in enumerate(stack))

    def _stacks_distance(self, stacks) -> float:
        return min((self._stack_distance(s) for s in stacks), default=np.inf)

    def tokens_to_finish(self, state: int) -> float:
        """The fewest one-byte tokens from ``state`` to a complete output (EOS not counted): an upper
        bound on the tokens a completion needs (multi-byte tokens may finish sooner)."""
        return self._stacks_distance(self._states[self._check_state(state)])

    def _token_reach(self, state: int) -> np.ndarray:
        """``(vocab,)``: for each token, an upper bound on the distance after it — exact for tokens
        walked through the stacks, the best over the stacks whose top frame reads it alone for the
        others — and ``inf`` for the tokens after which the text cannot be completed. The tokens
        the top frame reads alone are one vectorised look-up per stack (the frames below do not
        change); only those whose first byte some top frame can read are walked."""
        if state in self._reach:
            return self._reach[state]
        stacks = self._states[state]
        reach = np.full(self.vocab_size, np.inf)
        firsts = set()
        for stack in self.expand(stacks):
            depth = len(stack) - 1
            r, q = stack[-1]
            below = self._stack_distance(stack[:-1])
            if not np.isfinite(below):
                continue                              # a call whose return point cannot finish in depth
            after = self._local[r].next_rows(q)
            top = self._frame_distances(depth)[r]
            reach = np.minimum(reach, np.where(after >= 0, below + top[np.maximum(after, 0)], np.inf))
            row = self.dfas[r].transitions[q, :TEXT_BYTES]
            firsts.update(np.nonzero(row >= 0)[0].tolist())
        for b in firsts:                              # the rest: walked through the stacks
            for t in self._by_first[b]:
                if not np.isfinite(reach[t]):
                    reach[t] = self._stacks_distance(self._walk(stacks, self.tokens[t]))
        if self.eos_token_id is not None:
            reach[self.eos_token_id] = np.inf         # EOS is the constraint's to allow
        self._reach[state] = reach
        return reach
