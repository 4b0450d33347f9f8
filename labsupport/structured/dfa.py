"""The byte DFA every constraint compiles to, and what makes it minimal.

A :class:`DFA` is a table ``transitions[state, byte] → next state`` (``-1`` = dead) with
``accepting[state]``; state 0 is the start. :func:`trim` drops the states from which no accepting
state can be reached (so a prefix that keeps the DFA alive can always be finished) and
:func:`minimise` merges states with the same future (Moore's partition refinement). A compiled DFA
goes back into a grammar tree as a :class:`Machine` node (:mod:`~labsupport.structured.automaton`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DFA", "EmptyLanguageError", "Machine", "minimise", "trim"]


@dataclass(frozen=True, eq=False)
class Machine:
    """A compiled :class:`DFA` used as a tree node (the result of an intersection or complement)."""
    dfa: DFA


@dataclass
class DFA:
    """``transitions (num_states, 256) int32`` (-1 = dead), ``accepting (num_states,) bool``; start 0."""
    transitions: np.ndarray
    accepting: np.ndarray

    @property
    def num_states(self) -> int:
        return int(self.transitions.shape[0])

    def walk(self, state: int, data: bytes) -> int:
        """The state after reading ``data`` from ``state`` (-1 once it dies)."""
        for b in data:
            if state < 0:
                return -1
            state = int(self.transitions[state, b])
        return state

    def matches(self, text: str | bytes) -> bool:
        """True when the whole ``text`` is in the language."""
        s = self.walk(0, text.encode() if isinstance(text, str) else text)
        return s >= 0 and bool(self.accepting[s])


class EmptyLanguageError(ValueError):
    """The automaton accepts no string at all (a :class:`ValueError`, so callers that only report
    it need not tell it apart; those that draw a conclusion from emptiness catch this one alone)."""


def trim(dfa: DFA) -> DFA:
    """Drop states from which no accepting state is reachable (their edges become -1).

    Raises:
        EmptyLanguageError: the language is empty (the start state itself is dead).
    """
    live = dfa.accepting.copy()
    while True:
        t = dfa.transitions
        reach = ((t >= 0) & live[np.maximum(t, 0)]).any(axis=1) | live
        if (reach == live).all():
            break
        live = reach
    if not live[0]:
        raise EmptyLanguageError("the grammar matches no string at all")
    keep = np.flatnonzero(live)
    new_id = np.full(dfa.num_states + 1, -1, dtype=np.int32)
    new_id[keep] = np.arange(len(keep), dtype=np.int32)
    t = dfa.transitions[keep]
    t = np.where(t >= 0, new_id[np.maximum(t, 0)], -1).astype(np.int32)
    return DFA(t, dfa.accepting[keep])


def minimise(dfa: DFA) -> DFA:
    """Moore's partition refinement: merge states with the same future (start stays 0).

    Bytes that every state treats alike (all of ``a-z`` inside a string, say) are folded into
    one column first, so each refinement round compares a few columns instead of 256.
    """
    cols = np.unique(dfa.transitions, axis=1)
    cls = dfa.accepting.astype(np.int64)
    count = len(np.unique(cls))
    while True:
        succ = np.where(cols >= 0, cls[np.maximum(cols, 0)], -1)
        sig = np.concatenate([cls[:, None], succ], axis=1)
        _, new_cls = np.unique(sig, axis=0, return_inverse=True)
        cls = new_cls.reshape(-1)
        new_count = int(cls.max()) + 1
        if new_count == count:
            break
        count = new_count
    # renumber classes in order of first appearance so the start state's class is 0
    _, first = np.unique(cls, return_index=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    cls = rank[cls]
    reps = np.sort(first)
    t = dfa.transitions[reps]
    t = np.where(t >= 0, cls[np.maximum(t, 0)], -1).astype(np.int32)
    return DFA(t, dfa.accepting[reps])
