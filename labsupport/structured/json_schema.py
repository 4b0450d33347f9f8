"""A JSON Schema subset → grammar tree (then :func:`~.automaton.compile_tree` → DFA).

Supported (everything else raises ``ValueError`` naming the keyword):

============  ==========================================================================
``type``      ``"object"``, ``"array"``, ``"string"``, ``"integer"``, ``"number"``,
              ``"boolean"``, ``"null"`` (one type, not a list)
object        ``properties``, ``required`` (keys written in **any order** by default, each
              at most once, every required key present; ``any_order=False`` keeps the
              schema's order), ``additionalProperties: false`` (the default here)
array         ``items`` (one schema), ``minItems``, ``maxItems``
integer       ``minimum`` with ``maximum`` (both, |bound| < 10^15): an exact digit automaton
string        ``minLength``, ``maxLength`` (characters; an escape counts as one),
              ``pattern`` (the content must match the regex; the regex may not produce
              ``"``, ``\\`` or control characters)
any           ``enum``, ``const`` (JSON values written compactly), and the annotations
              ``title``, ``description``, ``default``, ``examples``, ``$schema``, ``$id``,
              ``$comment``
============  ==========================================================================

Nesting is unrestricted in depth because a schema without ``$ref`` is finite: each nested
object or array is copied into the automaton (no stack needed). Recursive schemas (``$ref``)
and ``anyOf`` / ``oneOf`` / ``allOf`` are not supported.

The strings follow the JSON grammar that XGrammar uses (Dong et al., 2024): a character is
anything but ``"``, ``\\``, a control character (< 0x20); escapes are ``\\" \\\\ \\/ \\b \\f
\\n \\r \\t \\uXXXX``. Integers are ``0 | -?[1-9][0-9]*``; numbers
``-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?``. Whitespace: with ``whitespace=0`` none
at all (compact ``{"a":1,"b":2}``); with ``whitespace=k`` up to ``k`` of ``[ \\n\\r\\t]``
around every ``{ } [ ] , :`` — the same as XGrammar's ``max_whitespace_cnt=k``.
"""

from __future__ import annotations

import json

from .regex import EMPTY, Alt, Chars, Keys, Repeat, Seq, chars, literal, parse_regex

ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment"}
TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
    "string": {"minLength", "maxLength", "pattern"},
    "integer": {"minimum", "maximum"}, "number": set(), "boolean": set(), "null": set(),
}
MAX_BOUND = 1000

STRING_CHAR = Alt((Chars(((0x20, 0x21), (0x23, 0x5B), (0x5D, 0xD7FF), (0xE000, 0x10FFFF))),
                   Seq((literal("\\"), Alt((chars('"\\\\/bfnrt'), Seq((literal("u"),) + (chars("0-9a-fA-F"),) * 4)))))))
INTEGER = Alt((literal("0"), Seq((Repeat(literal("-"), 0, 1), chars("1-9"), Repeat(chars("0-9"), 0, None)))))
NUMBER = Seq((Repeat(literal("-"), 0, 1),
              Alt((literal("0"), Seq((chars("1-9"), Repeat(chars("0-9"), 0, None))))),
              Repeat(Seq((literal("."), Repeat(chars("0-9"), 1, None))), 0, 1),
              Repeat(Seq((chars("eE"), Repeat(chars("+\\-"), 0, 1), Repeat(chars("0-9"), 1, None))), 0, 1)))
BOOLEAN = Alt((literal("true"), literal("false")))
NULL = literal("null")


def _bad(path: str, keyword: str, why: str) -> ValueError:
    return ValueError(f"JSON Schema keyword {keyword!r} at {path or '/'}: {why}")


def _bound(path: str, keyword: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BOUND:
        raise _bad(path, keyword, f"must be an integer in [0, {MAX_BOUND}], got {value!r}")
    return value


def _ws(whitespace: int):
    return Repeat(chars(" \\n\\r\\t"), 0, whitespace) if whitespace else EMPTY


def _value_literal(value) -> Seq:
    """A JSON value written compactly (``json.dumps`` with ``,`` and ``:`` separators)."""
    try:
        return literal(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    except (TypeError, ValueError) as err:
        raise ValueError(f"enum / const values must be JSON values, got {value!r}") from err


def _check_pattern_chars(node, path: str) -> None:
    """A ``pattern`` is written raw inside the quotes: it must not make ``"``, ``\\`` or controls."""
    if isinstance(node, Chars):
        for lo, hi in node.ranges:
            if lo < 0x20 or lo <= 0x22 <= hi or lo <= 0x5C <= hi:
                raise _bad(path, "pattern", "the regex can produce '\"', '\\' or a control character; "
                           "restrict its classes (e.g. [^\"\\\\] instead of .)")
    for child in getattr(node, "items", ()) + getattr(node, "options", ()):
        _check_pattern_chars(child, path)
    if isinstance(node, Repeat):
        _check_pattern_chars(node.item, path)


def schema_to_tree(schema: dict, *, whitespace: int = 0, any_order: bool = True, path: str = ""):
    """Translate ``schema`` into a grammar tree.

    Args:
        schema: a JSON Schema dict within the supported subset (module docstring).
        whitespace: most whitespace characters allowed at each structural position (0 = none).
        any_order: object keys in any order (each once) rather than the schema's order.
        path: JSON pointer of ``schema`` inside the root (for error messages).

    Raises:
        TypeError: ``schema`` is not a dict.
        ValueError: an unsupported keyword or type, a bad value, naming the keyword and path.
    """
    if not isinstance(schema, dict):
        raise TypeError(f"schema at {path or '/'} must be a dict, got {type(schema).__name__}")
    keys = set(schema) - ANNOTATIONS
    ws = _ws(whitespace)
    if "enum" in keys or "const" in keys:
        extra = keys - {"enum", "const", "type"}
        if extra:
            raise _bad(path, min(extra), "is not supported together with enum / const")
        if "const" in keys:
            return _value_literal(schema["const"])
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise _bad(path, "enum", f"must be a non-empty list, got {values!r}")
        return Alt(tuple(_value_literal(v) for v in values))
    if "type" not in keys:
        unknown = sorted(keys)
        raise _bad(path, unknown[0] if unknown else "type",
                   "is not supported" if unknown else "is required (or enum / const)")
    kind = schema["type"]
    if not isinstance(kind, str) or kind not in TYPE_KEYWORDS:
        raise _bad(path, "type", f"must be one of {sorted(TYPE_KEYWORDS)} (a single string), got {kind!r}")
    extra = keys - {"type"} - TYPE_KEYWORDS[kind]
    if extra:
        raise _bad(path, min(extra), f"is not supported for type {kind!r} "
                   f"(supported: {sorted(TYPE_KEYWORDS[kind]) or 'none'})")
    if kind == "integer":
        return _integer(schema, path)
    if kind == "number":
        return NUMBER
    if kind == "boolean":
        return BOOLEAN
    if kind == "null":
        return NULL
    if kind == "string":
        return _string(schema, path)
    if kind == "array":
        return _array(schema, whitespace, any_order, path, ws)
    return _object(schema, whitespace, any_order, path, ws)


MAX_INT_BOUND = 10 ** 15


def _digits(a: int, b: int, n: int):
    """Exactly ``n`` digits (leading zeros allowed) spelling a number in ``[a, b]``."""
    if n == 0:
        return EMPTY
    p = 10 ** (n - 1)
    da, db = a // p, b // p
    if da == db:
        return Seq((literal(str(da)), _digits(a % p, b % p, n - 1)))
    options = [Seq((literal(str(da)), _digits(a % p, p - 1, n - 1)))]
    if db - da > 1:
        options.append(Seq((chars(f"{da + 1}-{db - 1}"), Repeat(chars("0-9"), n - 1, n - 1))))
    options.append(Seq((literal(str(db)), _digits(0, b % p, n - 1))))
    return Alt(tuple(options))


def _non_negative(lo: int, hi: int):
    """Canonical decimal numerals (no leading zeros) of the integers in ``[lo, hi]``, lo >= 0."""
    options = []
    for n in range(1, len(str(hi)) + 1):
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10 ** n - 1)
        if a <= b:
            options.append(_digits(a, b, n))
    return options[0] if len(options) == 1 else Alt(tuple(options))


def integer_range(lo: int, hi: int):
    """The integers ``lo..hi`` as a tree, e.g. ``[0, 255]`` → ``[0-9] | [1-9][0-9] | 1[0-9][0-9] | 2[0-4][0-9] | 25[0-5]``."""
    options = []
    if lo < 0:
        options.append(Seq((literal("-"), _non_negative(max(1, -hi), -lo))))
    if hi >= 0:
        options.append(_non_negative(max(0, lo), hi))
    return options[0] if len(options) == 1 else Alt(tuple(options))


def _integer(schema: dict, path: str):
    if "minimum" not in schema and "maximum" not in schema:
        return INTEGER
    for kw in ("minimum", "maximum"):
        if kw not in schema:
            raise _bad(path, kw, "is needed too: integer bounds are supported as a minimum/maximum pair")
        v = schema[kw]
        if isinstance(v, bool) or not isinstance(v, int) or not -MAX_INT_BOUND < v < MAX_INT_BOUND:
            raise _bad(path, kw, f"must be an integer with |value| < 10^15, got {v!r}")
    lo, hi = schema["minimum"], schema["maximum"]
    if hi < lo:
        raise _bad(path, "maximum", f"must be >= minimum ({lo}), got {hi}")
    return integer_range(lo, hi)


def _string(schema: dict, path: str):
    quote = literal('"')
    if "pattern" in schema:
        if "minLength" in schema or "maxLength" in schema:
            raise _bad(path, "pattern", "cannot be combined with minLength / maxLength here")
        if not isinstance(schema["pattern"], str):
            raise _bad(path, "pattern", f"must be a string, got {schema['pattern']!r}")
        try:
            body = parse_regex(schema["pattern"])
        except ValueError as err:
            raise _bad(path, "pattern", str(err)) from None
        _check_pattern_chars(body, path)
        return Seq((quote, body, quote))
    low = _bound(path, "minLength", schema.get("minLength", 0))
    high = schema.get("maxLength")
    if high is not None:
        high = _bound(path, "maxLength", high)
        if high < low:
            raise _bad(path, "maxLength", f"must be >= minLength ({low}), got {high}")
    return Seq((quote, Repeat(STRING_CHAR, low, high), quote))


def _array(schema: dict, whitespace: int, any_order: bool, path: str, ws):
    if "items" not in schema:
        raise _bad(path, "items", "is required for arrays here (one schema for every item)")
    item = schema_to_tree(schema["items"], whitespace=whitespace, any_order=any_order, path=f"{path}/items")
    low = _bound(path, "minItems", schema.get("minItems", 0))
    high = schema.get("maxItems")
    if high is not None:
        high = _bound(path, "maxItems", high)
        if high < low:
            raise _bad(path, "maxItems", f"must be >= minItems ({low}), got {high}")
    more = Seq((ws, literal(","), ws, item))
    rest = Repeat(more, max(low - 1, 0), None if high is None else max(high - 1, 0))
    full = Seq((literal("["), ws, item, rest, ws, literal("]")))
    if low > 0:
        return full
    if high == 0:
        return Seq((literal("["), ws, literal("]")))
    return Alt((full, Seq((literal("["), ws, literal("]")))))


def _object(schema: dict, whitespace: int, any_order: bool, path: str, ws):
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise _bad(path, "properties", f"must be a dict of name -> schema, got {props!r}")
    required = schema.get("required", [])
    if not isinstance(required, list) or any(not isinstance(r, str) for r in required):
        raise _bad(path, "required", f"must be a list of property names, got {required!r}")
    missing = [r for r in required if r not in props]
    if missing:
        raise _bad(path, "required", f"names {missing[0]!r}, which is not in properties")
    if len(set(required)) != len(required):
        raise _bad(path, "required", f"lists a name twice: {required!r}")
    if schema.get("additionalProperties", False) is not False:
        raise _bad(path, "additionalProperties", "only false is supported (no keys beyond properties)")
    members = []
    for name, sub in props.items():
        value = schema_to_tree(sub, whitespace=whitespace, any_order=any_order, path=f"{path}/properties/{name}")
        key = _value_literal(name)
        members.append((name, Seq((key, ws, literal(":"), ws, value)), name in required))
    return Keys(members=tuple(members), any_order=any_order, open=literal("{"), first=ws,
                sep=Seq((ws, literal(","), ws)), close=Seq((ws, literal("}"))))
