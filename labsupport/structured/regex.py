"""Regular expressions → a small syntax tree over Unicode code points.

The tree has four kinds of node (``Chars``, ``Seq``, ``Alt``, ``Repeat``) plus ``Keys`` (a set
of object properties, built by :mod:`.json_schema`). :mod:`.automaton` compiles the tree to
a byte-level DFA. The same tree is produced from a regex string (:func:`parse_regex`) and
from a JSON Schema, so both share one compiler — the approach of Outlines (Willard & Louf,
2023, "Efficient Guided Generation for Large Language Models").

Supported regex syntax (the whole string must match; ``^`` / ``$`` at the ends are accepted
and ignored): literals, ``.`` (any character but newline), escapes ``\\d \\w \\s \\D \\W \\S``
``\\n \\t \\r \\f \\v \\a \\xHH \\uXXXX \\UXXXXXXXX`` and escaped punctuation, classes ``[a-z0-9_]``
and ``[^...]`` (a ``]`` right after ``[`` or ``[^`` is a literal, so ``[^]`` is unterminated, as
in Python's ``re``), groups ``( )`` and ``(?: )``, alternation ``|``, quantifiers ``* + ? {m}
{m,} {m,n}``. An unknown letter escape (``\\q``, ``\\e``) is an error, as in Python's ``re``.
``\\d \\w \\s`` are ASCII classes (as with ``re.ASCII``); XGrammar's ``\\s`` also takes Unicode
spaces. A top-level ``{"regex": …}`` spec must match the **whole** output; a JSON Schema
``pattern`` is a **search** (it may match anywhere in the string unless anchored).
Back-references, look-around, lazy quantifiers and anchors inside the pattern are
not regular (or not needed) and raise ``ValueError`` naming the construct.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
MAX_REPEAT = 1000          # {m,n} bounds above this would build huge automata
MAX_NESTING = 64           # groups inside groups (regex, EBNF), rules inlined into rules: deeper is refused


def nesting_error(what: str, limit: int = MAX_NESTING) -> ValueError:
    """The one message for structure too deep to compile (never a ``RecursionError``)."""
    return ValueError(f"structured_output: {what} nesting deeper than {limit} levels is not supported")


@dataclass(frozen=True)
class Chars:
    """One character out of a set, given as sorted, disjoint code-point ranges ``(lo, hi)``."""
    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Seq:
    """The items one after another (an empty ``Seq`` matches the empty string)."""
    items: tuple


@dataclass(frozen=True)
class Alt:
    """Exactly one of the options."""
    options: tuple


@dataclass(frozen=True)
class Repeat:
    """``item`` repeated ``low``..``high`` times (``high=None``: unbounded)."""
    item: object
    low: int
    high: int | None


@dataclass(frozen=True)
class RawByte:
    """One raw byte that no UTF-8 text contains (``0xF5`` … ``0xFF``): a grammar's reference to a
    recursive rule inside a rule's automaton (:mod:`.ebnf`, :mod:`.pushdown`)."""
    value: int


@dataclass(frozen=True)
class Keys:
    """JSON object members ``open (first member (sep member)*)? close`` with order rules.

    ``members[i] = (name, node, required)``; ``any_order=True`` lets members come in any
    order, each at most once, all required ones present; ``False`` keeps the listed order
    (optional ones may be skipped). ``open`` / ``first`` / ``sep`` / ``close`` are nodes (the
    braces, the comma and the whitespace around them). ``extra``: a node for one member that is
    not listed (JSON Schema's ``additionalProperties`` schema), allowed any number of times
    anywhere among the others; ``min_count`` / ``max_count`` bound the number of members written
    (``minProperties`` / ``maxProperties``; ``None``: no upper bound).
    """
    members: tuple
    any_order: bool
    open: object
    first: object
    sep: object
    close: object
    extra: object = None
    min_count: int = 0
    max_count: int | None = None


EMPTY = Seq(())


def normalise(ranges) -> tuple[tuple[int, int], ...]:
    """Sort and merge overlapping / touching ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def complement(ranges) -> tuple[tuple[int, int], ...]:
    """All code points (surrogates excluded) not in ``ranges``."""
    out, nxt = [], 0
    for lo, hi in normalise(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return normalise(_cut_surrogates(out))


def _cut_surrogates(ranges):
    out = []
    for lo, hi in ranges:
        if hi < SURROGATES[0] or lo > SURROGATES[1]:
            out.append((lo, hi))
            continue
        if lo < SURROGATES[0]:
            out.append((lo, SURROGATES[0] - 1))
        if hi > SURROGATES[1]:
            out.append((SURROGATES[1] + 1, hi))
    return out


def literal(text: str) -> Seq:
    """The node matching exactly ``text``."""
    return Seq(tuple(Chars(((ord(c), ord(c)),)) for c in text))


def chars(spec: str) -> Chars:
    """A class from a string of characters and ``a-z`` ranges, e.g. ``chars("0-9a-f")``."""
    return _parse_class_body(spec, 0, negate_ok=False)[0]


DIGIT = ((ord("0"), ord("9")),)
WORD = normalise([(ord("a"), ord("z")), (ord("A"), ord("Z")), DIGIT[0], (ord("_"), ord("_"))])
SPACE = normalise([(9, 13), (32, 32)])
CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE,
                 "D": complement(DIGIT), "W": complement(WORD), "S": complement(SPACE)}
CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a"}


def _escape(pattern: str, i: int) -> tuple[tuple[tuple[int, int], ...], int]:
    """Ranges of the escape starting after the backslash at ``pattern[i]``; returns the next index."""
    if i >= len(pattern):
        raise ValueError(f"regex {pattern!r}: a trailing backslash escapes nothing")
    c = pattern[i]
    if c in CLASS_ESCAPES:
        return CLASS_ESCAPES[c], i + 1
    if c in CHAR_ESCAPES:
        cp = ord(CHAR_ESCAPES[c])
        return ((cp, cp),), i + 1
    if c in "uxU":
        width = {"u": 4, "x": 2, "U": 8}[c]
        digits = pattern[i + 1:i + 1 + width]
        if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise ValueError(f"regex {pattern!r}: \\{c} needs {width} hex digits at position {i}")
        cp = int(digits, 16)
        if cp > MAX_CODE_POINT:
            raise ValueError(f"regex {pattern!r}: \\{c}{digits} is beyond the last code point U+10FFFF")
        return ((cp, cp),), i + 1 + width
    if c.isdigit() or c in "bBAzZkpPN":
        raise ValueError(f"regex {pattern!r}: escape \\{c} (back-reference, word boundary, anchor, named "
                         "character or Unicode property) is not supported")
    if c.isascii() and c.isalpha():                  # Python's re: an unknown letter escape is an error
        raise ValueError(f"regex {pattern!r}: bad escape \\{c} at position {i - 1} (as in Python's re)")
    return ((ord(c), ord(c)),), i + 1


def _class_atom(pattern: str, i: int) -> tuple[tuple[tuple[int, int], ...], int]:
    """One class member at ``pattern[i]`` (a character or an escape) → its ranges, next index."""
    if pattern[i] == "\\":
        return _escape(pattern, i + 1)
    return ((ord(pattern[i]), ord(pattern[i])),), i + 1


def _parse_class_body(pattern: str, i: int, negate_ok: bool = True) -> tuple[Chars, int]:
    """Members of a ``[...]`` class starting at ``pattern[i]`` (after the ``[``).

    With ``negate_ok=False`` the whole rest of ``pattern`` is the body (no ``]``), as used by
    :func:`chars`. Returns the class and the index after the closing ``]``.
    """
    bracketed = negate_ok
    negate = bracketed and i < len(pattern) and pattern[i] == "^"
    i += negate
    ranges: list[tuple[int, int]] = []
    first = i
    while True:
        if i >= len(pattern):
            if bracketed:
                raise ValueError(f"regex {pattern!r}: unterminated character class (a ']' right after '[' or "
                                 "'[^' is a literal, as in Python's re)")
            break
        if bracketed and pattern[i] == "]" and i > first:
            i += 1
            break
        got, i = _class_atom(pattern, i)
        single = len(got) == 1 and got[0][0] == got[0][1]
        if single and i + 1 < len(pattern) and pattern[i] == "-" and pattern[i + 1] != "]":
            hi_r, i = _class_atom(pattern, i + 1)
            lo, hi = got[0][0], hi_r[0][1]
            if len(hi_r) != 1 or hi < lo:
                raise ValueError(f"regex {pattern!r}: bad class range ending at position {i}")
            got = ((lo, hi),)
        ranges.extend(got)
    r = complement(ranges) if negate else normalise(_cut_surrogates(ranges))
    return Chars(r), i


class _Parser:
    """Recursive-descent parser: alternation → concatenation → quantified atom."""

    def __init__(self, pattern: str) -> None:
        self.p, self.i, self.depth = pattern, 0, 0

    def error(self, what: str) -> ValueError:
        return ValueError(f"regex {self.p!r}: {what} at position {self.i}")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def alternation(self):
        options = [self.concatenation()]
        while self.peek() == "|":
            self.i += 1
            options.append(self.concatenation())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def concatenation(self):
        items = []
        while self.peek() not in (None, "|", ")"):
            items.append(self.quantified())
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def quantified(self):
        node = self.atom()
        while self.peek() in ("*", "+", "?", "{"):
            c = self.peek()
            if c == "{":
                low, high = self.braces()
            else:
                self.i += 1
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            if self.peek() in ("?", "+"):
                raise self.error("lazy / possessive quantifiers are not supported")
            node = Repeat(node, low, high)
        return node

    def braces(self) -> tuple[int, int | None]:
        end = self.p.find("}", self.i)
        if end < 0:
            raise self.error("unterminated {m,n}")
        body = self.p[self.i + 1:end]
        parts = body.split(",")
        try:
            low = int(parts[0])
            high = low if len(parts) == 1 else (None if parts[1] == "" else int(parts[1]))
        except ValueError:
            raise self.error(f"bad repetition {{{body}}}") from None
        if len(parts) > 2 or low < 0 or (high is not None and high < low):
            raise self.error(f"bad repetition {{{body}}}")
        if max(low, high or 0) > MAX_REPEAT:
            raise self.error(f"repetition bound must be <= {MAX_REPEAT}, got {{{body}}}")
        self.i = end + 1
        return low, high

    def atom(self):
        c = self.peek()
        if c == "(":
            if self.p.startswith("(?:", self.i):
                self.i += 3
            elif self.p.startswith("(?", self.i):
                raise self.error("look-around and named / flagged groups are not supported")
            else:
                self.i += 1
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise nesting_error(f"regex {self.p[:40]!r}…: groups (at position {self.i})")
            node = self.alternation()
            self.depth -= 1
            if self.peek() != ")":
                raise self.error("unbalanced parenthesis")
            self.i += 1
            return node
        if c == "[":
            node, self.i = _parse_class_body(self.p, self.i + 1)
            return node
        if c == ".":
            self.i += 1
            return Chars(complement([(10, 10)]))
        if c == "\\":
            ranges, self.i = _escape(self.p, self.i + 1)
            return Chars(ranges)
        if c in ("*", "+", "?", "{", ")"):
            raise self.error(f"nothing to repeat before {c!r}" if c != ")" else "unbalanced parenthesis")
        if c in ("^", "$"):
            raise self.error("anchors ^ and $ are only accepted at the very start / end")
        self.i += 1
        return Chars(((ord(c), ord(c)),))


def parse_regex(pattern: str):
    """Parse ``pattern`` into a tree (whole-string match semantics).

    Raises:
        TypeError: ``pattern`` is not a string.
        ValueError: unsupported or malformed syntax, naming the construct and position.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"regex must be a str, got {pattern!r} ({type(pattern).__name__})")
    body = pattern.removeprefix("^")
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    parser = _Parser(body)
    node = parser.alternation()
    if parser.i != len(body):
        raise parser.error("unbalanced parenthesis")
    return node
