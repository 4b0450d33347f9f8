"""Syntax tree → byte-level NFA (Thompson, 1968) → DFA (subset construction, Rabin & Scott, 1959),
with the work bounded.

The NFA reads *bytes*: each character class becomes UTF-8 byte-range sequences (:func:`utf8_ranges`,
the way RE2 and Rust's ``regex`` do). Object members in any order (:class:`~.regex.Keys`) are built
with one *hub* state per subset of keys already written — ``2^n`` hubs for ``n`` keys, which is why
:data:`MAX_ANY_ORDER_KEYS` bounds ``n``. Nested bounded repetitions multiply: their expansion is
counted before anything is built (:func:`expansion_size`), and :func:`determinise` stops at a work
and a state budget, so a pathological pattern is refused in about a second ("grammar too large").
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .dfa import DFA, Machine
from .regex import Alt, Chars, Keys, RawByte, Repeat, Seq

__all__ = ["MAX_ANY_ORDER_KEYS", "MAX_DFA_STATES", "MAX_DFA_WORK", "MAX_NFA_STATES", "NFA", "determinise",
           "expansion_size", "utf8_ranges"]

MAX_ANY_ORDER_KEYS = 6        # 2^6 = 64 hubs × 6 member copies; 7+ raises ValueError
MAX_NFA_STATES = 200_000
MAX_DFA_STATES = 10_000
"""Most states a compiled DFA may have: each costs a token-index row (a walk of the whole
vocabulary, ~0.2 ms and ``vocab × 8`` bytes), so this bounds the compile's time and memory after
the subset construction too. The chapters' and tests' largest grammar has about 1,500."""
MAX_DFA_WORK = 4_000_000
"""Most steps the subset construction may take (NFA states and edges visited, summed over every DFA
state it makes): about a second of work on a laptop. The chapters' and tests' largest grammar
takes about 450,000; ``(a|b)*a(a|b){16}`` (131,072 DFA states) or ``((a{2,20}){2,20}){2,20}`` (whose
DFA states are each a set of thousands of NFA states) would take hundreds of millions."""


def utf8_ranges(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Split code points ``[lo, hi]`` into sequences of byte ranges, one per UTF-8 shape.

    Each returned sequence ``[(b1_lo, b1_hi), (b2_lo, b2_hi), ...]`` matches exactly the UTF-8
    encodings of a sub-range (surrogates are left out). Example: ``utf8_ranges(0x41, 0xE9)`` → ``[[(0x41, 0x7F)],
    [(0xC2, 0xC2), (0x80, 0xBF)], [(0xC3, 0xC3), (0x80, 0xA9)]]``.
    """
    # surrogates (U+D800–U+DFFF) have no UTF-8 encoding: no text contains them, so they match nothing
    stack = [(a, b) for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi)) if a <= b]
    out = []
    while stack:
        lo, hi = stack.pop()
        split = next((b for b in (0x7F, 0x7FF, 0xFFFF) if lo <= b < hi), None)
        if split is not None:
            stack += [(split + 1, hi), (lo, split)]
            continue
        if hi <= 0x7F:
            out.append([(lo, hi)])
            continue
        for i in (1, 2, 3):                       # align to continuation-byte boundaries
            m = (1 << (6 * i)) - 1
            if lo & ~m != hi & ~m:
                if lo & m:
                    stack += [((lo | m) + 1, hi), (lo, lo | m)]
                    break
                if hi & m != m:
                    stack += [(hi & ~m, hi), (lo, (hi & ~m) - 1)]
                    break
        else:
            a, b = chr(lo).encode(), chr(hi).encode()
            out.append(list(zip(a, b)))
    return sorted(out)


class NFA:
    """Byte edges ``(lo, hi, target)`` and ε-edges; states are list indices."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []

    def new(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise _too_large(f"more than {MAX_NFA_STATES:,} automaton states")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def build(self, node, start: int) -> int:
        """Add ``node`` starting at ``start``; return its end state."""
        if isinstance(node, Chars):
            end = self.new()
            for lo, hi in node.ranges:
                for seq in utf8_ranges(lo, hi):
                    s = start
                    for k, (blo, bhi) in enumerate(seq):
                        t = end if k == len(seq) - 1 else self.new()
                        self.edges[s].append((blo, bhi, t))
                        s = t
            return end
        if isinstance(node, Seq):
            for item in node.items:
                start = self.build(item, start)
            return start
        if isinstance(node, Alt):
            end = self.new()
            for option in node.options:
                s = self.new()
                self.eps[start].append(s)
                self.eps[self.build(option, s)].append(end)
            return end
        if isinstance(node, Repeat):
            for _ in range(node.low):
                start = self.build(node.item, start)
            end = self.new()
            self.eps[start].append(end)
            if node.high is None:                     # star: loop back through a fresh copy
                s = self.new()
                self.eps[end].append(s)
                self.eps[self.build(node.item, s)].append(end)
                return end
            for _ in range(node.high - node.low):     # optional copies, each may exit
                s = self.new()
                self.eps[start].append(s)
                start = self.build(node.item, s)
                self.eps[start].append(end)
            return end
        if isinstance(node, Keys):
            return self._keys(node, start)
        if isinstance(node, RawByte):
            end = self.new()
            self.edges[start].append((node.value, node.value, end))
            return end
        if isinstance(node, Machine):
            return self._machine(node.dfa, start)
        raise TypeError(f"unknown grammar node {node!r}")

    def _machine(self, dfa: DFA, start: int) -> int:
        """Copy a DFA in: one NFA state per DFA state, byte ranges of equal targets as one edge."""
        ids = [self.new() for _ in range(dfa.num_states)]
        end = self.new()
        self.eps[start].append(ids[0])
        for s, row in enumerate(dfa.transitions.tolist()):
            b = 0
            while b < 256:
                t, lo = row[b], b
                while b + 1 < 256 and row[b + 1] == t:
                    b += 1
                if t >= 0:
                    self.edges[ids[s]].append((lo, b, ids[t]))
                b += 1
            if dfa.accepting[s]:
                self.eps[ids[s]].append(end)
        return end

    def _keys(self, node: Keys, start: int) -> int:
        """Hub states: (the set of written keys (any order) or the last index written (fixed order),
        the members written so far, counted up to what ``min_count`` / ``max_count`` can tell apart)."""
        n = len(node.members)
        if node.any_order and n > MAX_ANY_ORDER_KEYS:
            raise ValueError(f"properties: at most {MAX_ANY_ORDER_KEYS} keys can be accepted in any order "
                             f"(the automaton needs 2^n states), got {n}; use any_order=False")
        required = {i for i, (_, _, req) in enumerate(node.members) if req}
        cap = node.max_count if node.max_count is not None else node.min_count
        if node.extra is not None:
            cap = max(cap, 1)                              # then c > 0 tells whether anything was written

        def count(c: int) -> int | None:                  # members written after one more; None: too many
            if node.max_count is not None and c + 1 > node.max_count:
                return None
            return min(c + 1, cap)

        first_hub = (frozenset() if node.any_order else -1, 0)
        hubs = {first_hub: self.build(node.open, start)}
        end = self.new()
        queue = deque([first_hub])
        while queue:
            hub = queue.popleft()
            keys, c = hub
            if node.any_order:
                done, nxt = bool(keys) or c > 0, [k for k in range(n) if k not in keys]
                can_close = required <= keys
            else:
                done = keys >= 0 or c > 0
                later = range(keys + 1, n)
                nxt = [j for j in later if not required & set(range(keys + 1, j))]
                can_close = not required & set(later)
            if can_close and c >= node.min_count:
                self.eps[self.build(node.close, hubs[hub])].append(end)
            moves = [((keys | {k}) if node.any_order else k, node.members[k][1]) for k in nxt]
            if node.extra is not None:
                moves.append((keys, node.extra))            # an unlisted member: the listed keys stay as they were
            for target_keys, member in moves:
                c2 = count(c)
                if c2 is None:
                    continue
                target = (target_keys, c2)
                s = self.build(node.sep if done else node.first, hubs[hub])
                s = self.build(member, s)
                if target not in hubs:
                    hubs[target] = self.new()
                    queue.append(target)
                self.eps[s].append(hubs[target])
        return end


def _closure(nfa: NFA, states) -> frozenset:
    seen, stack = set(states), list(states)
    while stack:
        for t in nfa.eps[stack.pop()]:
            if t not in seen:
                seen.add(t)
                stack.append(t)
    return frozenset(seen)


def _too_large(what: str) -> ValueError:
    return ValueError(f"grammar too large: {what} (lower repetition bounds, nested repetitions, enum sizes "
                      "or the number of any-order keys)")


def expansion_size(node, memo: dict | None = None) -> int:
    """NFA states :meth:`NFA.build` would make for ``node``, counted without building it (nested
    bounded repetitions multiply: ``((a{2,20}){2,20}){2,20}`` is 8,000 copies of ``a``). A subtree
    shared by several parents (a JSON array's item schema) is counted once per use but measured
    once. Any-order keys are counted while they are built."""
    memo = {} if memo is None else memo
    hit = memo.get(id(node))
    if hit is not None:
        return hit
    if isinstance(node, Chars):
        size = 1 + sum(len(seq) for lo, hi in node.ranges for seq in utf8_ranges(lo, hi))
    elif isinstance(node, Seq):
        size = sum(expansion_size(i, memo) for i in node.items)
    elif isinstance(node, Alt):
        size = 1 + sum(1 + expansion_size(o, memo) for o in node.options)
    elif isinstance(node, Repeat):
        copies = node.low + 1 if node.high is None else node.high
        size = 2 + copies * (expansion_size(node.item, memo) + 1)
    elif isinstance(node, Machine):
        size = node.dfa.num_states + 1
    else:
        size = 1
    memo[id(node)] = size
    return size


def determinise(nfa: NFA, start: int, final: int, max_work: int = MAX_DFA_WORK,
                max_states: int = MAX_DFA_STATES) -> DFA:
    """Subset construction (Rabin & Scott, 1959): one DFA state per reachable set of NFA states.

    Bytes are handled in *classes*: the edges' range boundaries cut 0…255 into intervals that every
    edge treats alike (``(a|b)*`` has four: below ``a``, ``a``, ``b``, above), so each DFA state
    looks at a few classes instead of 256 bytes.

    Raises:
        ValueError: "grammar too large" once the work passes ``max_work`` steps (NFA states and
            edges visited) or the DFA passes ``max_states`` states (before minimising) — checked as
            it goes, so a pathological pattern is refused within about a second instead of running
            for minutes.
    """
    bounds = sorted({0, 256} | {b for row in nfa.edges for lo, hi, _ in row for b in (lo, hi + 1)})
    at = {b: k for k, b in enumerate(bounds)}
    edges = [[(at[lo], at[hi + 1], t) for lo, hi, t in row] for row in nfa.edges]   # class spans
    num_classes = len(bounds) - 1
    first = _closure(nfa, [start])
    ids, order = {first: 0}, [first]
    rows: list[list[int]] = []
    cache: dict[tuple, frozenset] = {}
    work, i = 0, 0
    while i < len(order):
        per_class: list[set] = [set() for _ in range(num_classes)]
        work += len(order[i]) + num_classes
        for s in order[i]:
            for a, b, t in edges[s]:
                work += b - a
                for c in range(a, b):
                    per_class[c].add(t)
        row = []
        for targets in per_class:
            if not targets:
                row.append(-1)
                continue
            key = tuple(sorted(targets))
            if key not in cache:
                cache[key] = _closure(nfa, key)
                work += len(cache[key])
            nxt = cache[key]
            if nxt not in ids:
                ids[nxt] = len(order)
                order.append(nxt)
            row.append(ids[nxt])
        if work > max_work:
            raise _too_large(f"building its automaton takes more than {max_work:,} steps "
                             f"({len(order):,} states found so far)")
        if len(order) > max_states:
            raise _too_large(f"its automaton has more than {max_states:,} states")
        rows.append(row)
        i += 1
    by_class = np.asarray(rows, dtype=np.int32).reshape(-1, num_classes)
    byte_class = np.repeat(np.arange(num_classes), np.diff(bounds))
    return DFA(np.ascontiguousarray(by_class[:, byte_class]), np.asarray([final in s for s in order], dtype=bool))
