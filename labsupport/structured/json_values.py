"""The JSON texts of scalar values as grammar trees: strings (lengths, ``pattern``, ``format``),
integers (bounds, exclusive bounds, ``multipleOf``), numbers, booleans, null.

Strings follow the JSON grammar XGrammar uses (Dong et al., 2024): a character is anything but
``"``, ``\\``, a control character (< 0x20); escapes are ``\\" \\\\ \\/ \\b \\f \\n \\r \\t
\\uXXXX``. Integers are ``0 | -?[1-9][0-9]*``; numbers ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?``.
"""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np

from ..validation import is_int, is_real
from .automaton import DFA, EmptyLanguageError, Machine, compile_tree, intersect
from .regex import EMPTY, Alt, Chars, Repeat, Seq, chars, literal, parse_regex

STRING_CHAR = Alt((Chars(((0x20, 0x21), (0x23, 0x5B), (0x5D, 0xD7FF), (0xE000, 0x10FFFF))),
                   Seq((literal("\\"), Alt((chars('"\\\\/bfnrt'), Seq((literal("u"),) + (chars("0-9a-fA-F"),) * 4)))))))
INTEGER = Alt((literal("0"), Seq((Repeat(literal("-"), 0, 1), chars("1-9"), Repeat(chars("0-9"), 0, None)))))
NUMBER = Seq((Repeat(literal("-"), 0, 1),
              Alt((literal("0"), Seq((chars("1-9"), Repeat(chars("0-9"), 0, None))))),
              Repeat(Seq((literal("."), Repeat(chars("0-9"), 1, None))), 0, 1),
              Repeat(Seq((chars("eE"), Repeat(chars("+\\-"), 0, 1), Repeat(chars("0-9"), 1, None))), 0, 1)))
BOOLEAN = Alt((literal("true"), literal("false")))
NULL = literal("null")
MAX_BOUND = 1000
MAX_INT_BOUND = 10 ** 15
MAX_MULTIPLE = 10_000


def bad(path: str, keyword: str, why: str, error: type[Exception] = ValueError) -> Exception:
    return error(f"JSON Schema keyword {keyword!r} at {path or '/'}: {why}")


def length_bound(path: str, keyword: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(path, keyword, f"must be an integer in [0, {MAX_BOUND}], got {value!r} ({type(value).__name__})",
                  TypeError)
    if not 0 <= value <= MAX_BOUND:
        raise bad(path, keyword, f"must be an integer in [0, {MAX_BOUND}], got {value!r}")
    return value


def length_range(schema: dict, path: str, low_kw: str, high_kw: str) -> tuple[int, int | None]:
    """``(low, high)`` of a pair of length keywords (``minLength``/``maxLength``, ``minItems``/``maxItems``)."""
    low = length_bound(path, low_kw, schema.get(low_kw, 0))
    high = schema.get(high_kw)
    if high is not None:
        high = length_bound(path, high_kw, high)
        if high < low:
            raise bad(path, high_kw, f"must be >= {low_kw} ({low}), got {high}")
    return low, high


# ----------------------------------------------------------------------------- integers

def _digits(a: int, b: int, n: int):
    """Exactly ``n`` digits (leading zeros allowed) spelling a number in ``[a, b]``."""
    if n == 0:
        return EMPTY
    if a == 0 and b == 10 ** n - 1:                  # every n-digit string: no need to split (and split
        return Repeat(chars("0-9"), n, n)            # again on both sides, 2^n calls)
    p = 10 ** (n - 1)
    da, db = a // p, b // p
    if da == db:
        return Seq((literal(str(da)), _digits(a % p, b % p, n - 1)))
    options = [Seq((literal(str(da)), _digits(a % p, p - 1, n - 1)))]
    if db - da > 1:
        options.append(Seq((chars(f"{da + 1}-{db - 1}"), Repeat(chars("0-9"), n - 1, n - 1))))
    options.append(Seq((literal(str(db)), _digits(0, b % p, n - 1))))
    return Alt(tuple(options))


def _non_negative(lo: int, hi: int | None):
    """Canonical numerals (no leading zeros) of the integers in ``[lo, hi]``, ``lo >= 0``; ``hi=None``: no top."""
    top = hi if hi is not None else 10 ** len(str(lo)) - 1
    options = []
    for n in range(1, len(str(top)) + 1):
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(top, 10 ** n - 1)
        if a <= b:
            options.append(_digits(a, b, n))
    if hi is None:                                   # every numeral longer than lo's
        options.append(Seq((chars("1-9"), Repeat(chars("0-9"), len(str(lo)), None))))
    return options[0] if len(options) == 1 else Alt(tuple(options))


def integer_range(lo: int | None, hi: int | None):
    """The integers ``lo..hi`` as a tree (either bound may be ``None``: unbounded on that side),
    e.g. ``[0, 255]`` → ``[0-9] | [1-9][0-9] | 1[0-9][0-9] | 2[0-4][0-9] | 25[0-5]``. Canonical
    numerals only: ``-0`` (valid JSON for zero, never written by ``json.dumps``) is not allowed."""
    if lo is None and hi is None:
        return INTEGER
    options = []
    if lo is None or lo < 0:                         # the negative part: "-" and a magnitude in [neg_lo, neg_hi]
        neg_lo = 1 if hi is None or hi >= 0 else -hi
        neg_hi = None if lo is None else -lo
        if neg_hi is None or neg_lo <= neg_hi:
            options.append(Seq((literal("-"), _non_negative(neg_lo, neg_hi))))
    if hi is None or hi >= 0:
        options.append(_non_negative(max(0, lo) if lo is not None else 0, hi))
    return options[0] if len(options) == 1 else Alt(tuple(options))


def multiple_of(k: int) -> DFA:
    """The canonical integer numerals divisible by ``k``: a remainder automaton (state = value mod k
    of the digits read so far; reading digit d moves r to (10r + d) mod k), intersected with the
    numeral grammar."""
    n = k + 2                                         # 0: start, 1: after '-', 2 + r: remainder r
    t = np.full((n, 256), -1, dtype=np.int32)
    t[0, ord("-")] = 1
    for src in (0, 1):
        for d in range(10):
            t[src, ord("0") + d] = 2 + d % k
    for r in range(k):
        for d in range(10):
            t[2 + r, ord("0") + d] = 2 + (10 * r + d) % k
    acc = np.zeros(n, dtype=bool)
    acc[2] = True
    return intersect(compile_tree(INTEGER), DFA(t, acc))


def integer_tree(schema: dict, path: str):
    """``type: integer`` with ``minimum`` / ``maximum`` / ``exclusiveMinimum`` / ``exclusiveMaximum``
    (integers or numbers; either side may be open) and an integer ``multipleOf``."""
    low, high = _bounds(schema, path)
    lo = None if low is None else (math.floor(low[0]) + 1 if low[1] else math.ceil(low[0]))
    hi = None if high is None else (math.ceil(high[0]) - 1 if high[1] else math.floor(high[0]))
    if lo is not None and hi is not None and hi < lo:
        raise bad(path, high[2], f"leaves no integer: with {low[2]} {low[0]!r} and {high[2]} {high[0]!r} "
                                 f"the integers would be [{lo}, {hi}]")
    tree = integer_range(lo, hi)
    if "multipleOf" in schema:
        k = schema["multipleOf"]
        if not is_real(k):
            raise bad(path, "multipleOf", f"must be an integer in [1, {MAX_MULTIPLE}] for integers, got {k!r} "
                                          f"({type(k).__name__})", TypeError)
        if not is_int(k) and math.isfinite(k) and float(k).is_integer():
            k = int(k)
        if not is_int(k) or not 1 <= k <= MAX_MULTIPLE:
            raise bad(path, "multipleOf", f"must be an integer in [1, {MAX_MULTIPLE}] for integers, got {k!r}")
        k = int(k)
        if k > 1:
            try:
                return Machine(intersect(compile_tree(tree), multiple_of(k)))
            except EmptyLanguageError:
                raise bad(path, "multipleOf", f"no multiple of {k} lies within the bounds") from None
            except ValueError as err:                                        # too large: said as it is
                raise bad(path, "multipleOf", str(err)) from None
    return tree


def _bounds(schema: dict, path: str) -> tuple[tuple, tuple]:
    """``((low, strict, keyword), (high, strict, keyword))`` of the four bound keywords (``None`` where
    absent), the tightest of each side."""
    low = high = None
    for kw, up, strict in (("minimum", False, False), ("exclusiveMinimum", False, True),
                           ("maximum", True, False), ("exclusiveMaximum", True, True)):
        if kw not in schema:
            continue
        v = schema[kw]
        if not is_real(v):
            raise bad(path, kw, f"must be a number with |value| < 10^15, got {v!r} ({type(v).__name__})", TypeError)
        v = int(v) if is_int(v) else float(v)                  # numpy numbers as Python's
        if not math.isfinite(v) or abs(v) >= MAX_INT_BOUND:
            raise bad(path, kw, f"must be a number with |value| < 10^15, got {v!r}")
        side = (v, strict, kw)
        if up:
            high = side if high is None or v < high[0] or (v == high[0] and strict) else high
        else:
            low = side if low is None or v > low[0] or (v == low[0] and strict) else low
    return low, high


# ----------------------------------------------------------------------------- numbers

_DIGIT, _DIGITS = chars("0-9"), Repeat(chars("0-9"), 0, None)


def _fraction_at_least(f: str):
    """Fraction digits ``F`` (one or more) with ``0.F >= 0.f`` (``f`` without trailing zeros): at the
    first digit where they differ ``F``'s is larger, or ``F`` starts with ``f``."""
    options = [Seq((literal(f), _DIGITS)) if f else Seq((_DIGIT, _DIGITS))]
    for j, d in enumerate(f):
        if d != "9":
            options.append(Seq((literal(f[:j]), chars(f"{int(d) + 1}-9"), _DIGITS)))
    return Alt(tuple(options))


def _fraction_at_most(f: str):
    """Fraction digits ``F`` with ``0.F <= 0.f``: at the first difference ``F``'s digit is smaller,
    or ``F`` is a prefix of ``f``, or ``f`` followed by zeros."""
    if not f:
        return Repeat(literal("0"), 1, None)
    options = [Seq((literal(f), Repeat(literal("0"), 0, None)))]
    options += [literal(f[:m]) for m in range(1, len(f))]
    for j, d in enumerate(f):
        if d != "0":
            options.append(Seq((literal(f[:j]), chars(f"0-{int(d) - 1}"), _DIGITS)))
    return Alt(tuple(options))


def _split(x: Decimal) -> tuple[int, str]:
    """A non-negative decimal as (whole part, fraction digits without trailing zeros)."""
    whole = int(x)
    frac = format(x - whole, "f").partition(".")[2].rstrip("0")
    return whole, frac


def decimal_range(lo: Decimal, hi: Decimal | None, positive: bool = False):
    """The plain JSON numerals ``I`` and ``I.F`` (no exponent) with ``lo <= value <= hi``, ``lo >= 0``
    (``hi=None``: no top; ``positive``: value 0 excluded). The whole part ``I`` decides most of it;
    only at ``I = floor(lo)`` and ``I = floor(hi)`` are the fraction's digits compared, one by one."""
    a, fa = _split(lo)
    options = []
    ints_lo = max(a + (1 if fa else 0), 1 if positive else 0)
    ints_hi = None if hi is None else int(hi)
    if ints_hi is None or ints_lo <= ints_hi:
        options.append(_non_negative(ints_lo, ints_hi))                     # no fraction
    at_least = _fraction_at_least(fa)
    if positive and a == 0 and not fa:                                     # 0.F must not be zero
        at_least = Seq((_DIGITS, chars("1-9"), _DIGITS))
    if hi is None:
        options.append(Seq((literal(f"{a}."), at_least)))
        options.append(Seq((_non_negative(a + 1, None), literal("."), _DIGIT, _DIGITS)))
        return Alt(tuple(options))
    b, fb = _split(hi)
    if a == b:
        both = intersect(compile_tree(at_least), compile_tree(_fraction_at_most(fb)))
        options.append(Seq((literal(f"{a}."), Machine(both))))
    else:
        options.append(Seq((literal(f"{a}."), at_least)))
        if b - a > 1:
            options.append(Seq((_non_negative(a + 1, b - 1), literal("."), _DIGIT, _DIGITS)))
        options.append(Seq((literal(f"{b}."), _fraction_at_most(fb))))
    return Alt(tuple(options))


def _inclusive(side, up: bool) -> Decimal:
    """A bound as an inclusive exact decimal. Validators compare parsed floats, so a strict bound
    ``b`` becomes the next float beyond it: a text between the two would parse to ``b`` itself."""
    v, strict, _ = side
    if strict:
        v = math.nextafter(float(v), -math.inf if up else math.inf)
    return Decimal(v) if isinstance(v, int) else Decimal(repr(float(v)))


def number_tree(schema: dict, path: str):
    """``type: number``: any JSON number; with bounds (``minimum``, ``maximum``, either exclusive,
    whole or fractional) the plain numerals ``I`` and ``I.F`` in range, no exponent — a subset of
    the valid texts, every one of them valid (bounds are compared digit by digit in
    :func:`decimal_range`); an integer ``multipleOf`` allows integers only."""
    if "multipleOf" in schema:
        k = schema["multipleOf"]
        if not is_real(k):
            raise bad(path, "multipleOf", f"must be a number, got {k!r} ({type(k).__name__})", TypeError)
        if not is_int(k) and not (math.isfinite(k) and float(k).is_integer()):
            raise bad(path, "multipleOf", f"for type 'number' only an integer multipleOf is built here, got {k!r}")
        return integer_tree(schema, path)                      # a multiple of an integer is an integer
    low, high = _bounds(schema, path)
    if low is None and high is None:
        return NUMBER
    lo = None if low is None else _inclusive(low, up=False)
    hi = None if high is None else _inclusive(high, up=True)
    if lo is not None and hi is not None and hi < lo:
        raise bad(path, high[2], f"leaves no number: {low[2]} is {low[0]!r} and {high[2]} is {high[0]!r}")
    options = []
    if hi is None or hi >= 0:                                  # value >= 0: "I" or "I.F"
        options.append(decimal_range(max(lo, Decimal(0)) if lo is not None else Decimal(0), hi))
    if lo is None or lo < 0:                                   # value < 0: "-" and a magnitude
        m_lo = max(-hi, Decimal(0)) if hi is not None else Decimal(0)
        options.append(Seq((literal("-"), decimal_range(m_lo, None if lo is None else -lo, positive=True))))
    return options[0] if len(options) == 1 else Alt(tuple(options))


# ----------------------------------------------------------------------------- strings

_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
_LEAP = "([0-9][0-9](0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
_DATE = ("([0-9]{4}-(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|[0-9]{4}-(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         "|[0-9]{4}-02-(0[1-9]|1[0-9]|2[0-8])|" + _LEAP + "-02-29)")
_TIME = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
FORMATS = {
    "date": _DATE,                                   # RFC 3339 full-date, Feb 29 only in leap years
    "time": _TIME,                                   # RFC 3339 full-time (no leap second)
    "date-time": _DATE + "T" + _TIME,
    "email": "[A-Za-z0-9._%+-]+@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+",
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": _OCTET + "(\\." + _OCTET + "){3}",
}
"""``format`` → the regex of its content. ``email`` is a conservative subset of RFC 5321 (dot-atom
local part, host names): every string it allows is a valid address, not every address is allowed."""


def check_pattern_chars(node, path: str, keyword: str = "pattern") -> None:
    """A pattern is written raw inside the quotes: it must not make ``"``, ``\\`` or controls."""
    if isinstance(node, Chars):
        for lo, hi in node.ranges:
            if lo < 0x20 or lo <= 0x22 <= hi or lo <= 0x5C <= hi:
                raise bad(path, keyword, "the regex can produce '\"', '\\' or a control character; "
                          "restrict its classes (e.g. [^\"\\\\] instead of .)")
    for child in getattr(node, "items", ()) + getattr(node, "options", ()):
        check_pattern_chars(child, path, keyword)
    if isinstance(node, Repeat):
        check_pattern_chars(node.item, path, keyword)


def _pattern_tree(pattern, path: str):
    """JSON Schema's ``pattern`` is a **search** (ECMA-262 semantics: the regex may match anywhere
    in the string unless anchored with ``^`` / ``$``): ``STRING_CHAR* (regex) STRING_CHAR*``."""
    if not isinstance(pattern, str):
        raise bad(path, "pattern", f"must be a string, got {pattern!r}")
    start = pattern.startswith("^")
    end = pattern.endswith("$") and not pattern.endswith("\\$")
    try:
        body = parse_regex(pattern)
    except ValueError as err:
        raise bad(path, "pattern", str(err)) from None
    check_pattern_chars(body, path)
    free = Repeat(STRING_CHAR, 0, None)
    return Seq(((EMPTY if start else free), body, (EMPTY if end else free)))


def string_tree(schema: dict, path: str):
    """``type: string`` with ``minLength`` / ``maxLength`` (characters; an escape counts as one),
    ``pattern`` (a search) and ``format`` (:data:`FORMATS`), all of them at once (intersection)."""
    quote = literal('"')
    low, high = length_range(schema, path, "minLength", "maxLength")
    parts = [Repeat(STRING_CHAR, low, high)]
    if "pattern" in schema:
        parts.append(_pattern_tree(schema["pattern"], path))
    if "format" in schema:
        fmt = schema["format"]
        if fmt not in FORMATS:
            raise bad(path, "format", f"must be one of {sorted(FORMATS)}, got {fmt!r} (an unknown format is not "
                      "ignored here: it would let invalid strings through)")
        parts.append(parse_regex(FORMATS[fmt]))
    if len(parts) == 1:
        return Seq((quote, parts[0], quote))
    machine = compile_tree(Seq((quote, parts[0], quote)))
    for extra in parts[1:]:
        try:
            machine = intersect(machine, compile_tree(Seq((quote, extra, quote))))
        except EmptyLanguageError:
            raise bad(path, "pattern" if "pattern" in schema else "format",
                      "no string satisfies the length bounds, pattern and format together") from None
        except ValueError as err:                                            # too large: said as it is
            raise bad(path, "pattern" if "pattern" in schema else "format", str(err)) from None
    return Machine(machine)
