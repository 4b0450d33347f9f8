"""Syntax tree → minimal byte DFA, and the boolean operations on DFAs.

:func:`compile_tree` runs the pipeline: the tree's expansion counted and built into a byte NFA, the
subset construction under its work budget (:mod:`~labsupport.structured.nfa`), then dead states
trimmed and the DFA minimised (:mod:`~labsupport.structured.dfa`). Every name of those two modules is
also importable from here.

**Boolean operations** are where automata beat grammars: the product of two DFAs accepts the
**intersection** of their languages (:func:`intersect`, JSON Schema's ``allOf``), flipping the
accepting states of a complete DFA gives the **complement** (:func:`complement`, ``not``), and
whether two languages share a string is a search of the product (:func:`disjoint`, what makes
``oneOf`` exact: with disjoint branches "exactly one" equals "at least one"). A compiled DFA
goes back into a tree as a :class:`Machine` node, so these results nest like any other piece.
"""

from __future__ import annotations

import numpy as np

from .dfa import DFA, EmptyLanguageError, Machine, minimise, trim
from .nfa import (
    MAX_ANY_ORDER_KEYS,
    MAX_DFA_STATES,
    MAX_DFA_WORK,
    MAX_NFA_STATES,
    NFA,
    _too_large,
    determinise,
    expansion_size,
    utf8_ranges,
)

__all__ = ["DFA", "MAX_ANY_ORDER_KEYS", "MAX_DFA_STATES", "MAX_DFA_WORK", "MAX_NFA_STATES", "MAX_PRODUCT_STATES",
           "NFA", "EmptyLanguageError", "Machine", "compile_tree", "complement", "determinise", "difference",
           "disjoint", "expansion_size", "intersect", "minimise", "trim", "utf8_ranges"]

MAX_PRODUCT_STATES = 100_000


def _byte_starts(*dfas: DFA) -> np.ndarray:
    """First byte of each class of bytes that every state of ``dfas`` treats alike."""
    cut = np.zeros(256, dtype=bool)
    cut[0] = True
    for d in dfas:
        cut[1:] |= (d.transitions[:, 1:] != d.transitions[:, :-1]).any(axis=0)
    return np.flatnonzero(cut)


def _product(a: DFA, b: DFA, accept) -> DFA:
    """The reachable product of two DFAs (a dead side is state -1), accepting where ``accept(x, y)``;
    one column per byte class of the pair (see :func:`determinise`)."""
    starts = _byte_starts(a, b)
    ta, tb = a.transitions[:, starts].tolist(), b.transitions[:, starts].tolist()
    dead = [-1] * len(starts)
    ids = {(0, 0): 0}
    order = [(0, 0)]
    rows = []
    i = 0
    while i < len(order):
        x, y = order[i]
        row = []
        for p, q in zip(ta[x] if x >= 0 else dead, tb[y] if y >= 0 else dead):
            if p < 0 and q < 0:
                row.append(-1)
                continue
            if (p, q) not in ids:
                ids[(p, q)] = len(order)
                order.append((p, q))
                if len(order) > MAX_PRODUCT_STATES:
                    raise ValueError(f"grammar too large: a combination of two automata needs more than "
                                     f"{MAX_PRODUCT_STATES} states")
            row.append(ids[(p, q)])
        rows.append(row)
        i += 1
    acc = [accept(x >= 0 and bool(a.accepting[x]), y >= 0 and bool(b.accepting[y])) for x, y in order]
    byte_class = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, 256)))
    by_class = np.asarray(rows, dtype=np.int32).reshape(-1, len(starts))
    return DFA(np.ascontiguousarray(by_class[:, byte_class]), np.asarray(acc, dtype=bool))


def intersect(a: DFA, b: DFA) -> DFA:
    """The DFA of ``L(a) ∩ L(b)``, trimmed and minimal.

    Raises:
        EmptyLanguageError: the intersection is empty ("matches no string at all").
        ValueError: the product would be too large.
    """
    return minimise(trim(_product(a, b, lambda p, q: p and q)))


def difference(a: DFA, b: DFA) -> DFA:
    """The DFA of ``L(a) \\ L(b)`` (``a`` and not ``b``: the complement of ``b`` within ``a``).

    Raises:
        ValueError: nothing of ``a`` is left.
    """
    return minimise(trim(_product(a, b, lambda p, q: p and not q)))


def complement(a: DFA, within: DFA) -> DFA:
    """``L(within) \\ L(a)``: a complement is only meaningful inside a universe (here: the JSON
    texts of the positive part of a schema), so it is taken within one."""
    return difference(within, a)


def disjoint(a: DFA, b: DFA) -> bool:
    """True when no string is in both languages (a search of the product for a common accepting state).

    Raises:
        ValueError: the product is too large to search (then nothing is proven either way)."""
    try:
        intersect(a, b)
    except EmptyLanguageError:
        return True
    return False


def compile_tree(node) -> DFA:
    """Tree → trimmed, minimal byte DFA.

    Raises:
        ValueError: the language is empty, or the automaton would be too large ("grammar too large":
            its expansion counted before building, then the work of the subset construction).
    """
    size = expansion_size(node)
    if size > MAX_NFA_STATES:
        raise _too_large(f"its repetitions expand to {size:,} automaton states, more than {MAX_NFA_STATES:,}")
    nfa = NFA()
    start = nfa.new()
    end = nfa.build(node, start)
    return minimise(trim(determinise(nfa, start, end)))
