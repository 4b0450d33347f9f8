"""JSON Schema keywords, one case each, in the spirit of the official JSON Schema test suite:
every listed valid instance (written compactly) is accepted, every listed invalid one is not,
and every text the automaton can produce (random walks) is a valid instance (checked by
``jsonschema`` and, for formats, by Python's own parsers)."""

import datetime
import ipaddress
import json
import random
import re
import uuid

import jsonschema
import pytest

from labsupport.structured import compile_tree, schema_to_tree
from labsupport.structured.automaton import complement, disjoint, intersect

DEFS = {"$defs": {"small": {"type": "integer", "minimum": 0, "maximum": 9}}}

CASES = [
    # (schema, valid instances, invalid instances)
    ({"type": ["string", "null"], "maxLength": 2}, ["ab", None, ""], ["abc", 1, False]),
    ({"type": "string", "enum": ["a", 1, None]}, ["a"], [1, None, "b"]),
    ({"enum": ["a", 1, [1, 2], {"k": True}]}, ["a", 1, [1, 2], {"k": True}], ["b", 2, [2, 1]]),
    ({"const": {"a": [1, None]}}, [{"a": [1, None]}], [{"a": [1]}, None]),
    ({"enum": ["ab", "abcdef", 3], "maxLength": 3}, ["ab", 3], ["abcdef"]),
    ({"type": "integer", "minimum": -3}, [-3, 0, 7, 12345678901], [-4, -100, 1.5]),
    ({"type": "integer", "maximum": 20}, [20, -5, 0, -1000000], [21, 100]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, [1, 9], [0, 10, -1]),
    ({"type": "integer", "exclusiveMinimum": 2.5, "maximum": 4.7}, [3, 4], [2, 5]),
    ({"type": "integer", "multipleOf": 7, "minimum": -30, "maximum": 100}, [0, 7, -28, 98], [1, 6, 105, -35]),
    ({"type": "integer", "multipleOf": 3}, [0, 3, 999, -12], [1, 1000]),
    ({"type": "string", "pattern": "ab+"}, ["ab", "xxabbby", "ab!"], ["a", "ba", ""]),
    ({"type": "string", "pattern": "^ab+$"}, ["ab", "abbb"], ["xab", "abx"]),
    ({"type": "string", "pattern": "[0-9]", "minLength": 2, "maxLength": 3}, ["a1", "123"], ["1", "ab", "1234"]),
    ({"type": "string", "format": "date"}, ["2024-02-29", "2023-12-31", "2000-02-29"],
     ["2023-02-29", "1900-02-29", "2024-13-01", "2024-04-31", "24-01-01"]),
    ({"type": "string", "format": "time"}, ["23:59:59Z", "00:00:00.5+05:30"], ["24:00:00Z", "12:00:00", "1:00:00Z"]),
    ({"type": "string", "format": "date-time"}, ["2024-05-17T08:30:00Z"], ["2024-05-17 08:30:00Z"]),
    ({"type": "string", "format": "email"}, ["ann@example.org", "a.b+c@x-y.co"], ["ann", "@x.org", "a@b"]),
    ({"type": "string", "format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000"]),
    ({"type": "string", "format": "ipv4"}, ["0.0.0.0", "255.255.255.255", "10.1.2.3"], ["256.1.1.1", "01.2.3.4", "1.2.3"]),
    ({"anyOf": [{"type": "integer", "maximum": 0}, {"type": "string", "maxLength": 1}]}, [-5, 0, "x"], [1, "xy"]),
    ({"allOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 5}, {"multipleOf": 2}]},
     [0, 2, 4], [6, 3, -2]),
    ({"allOf": [{"type": "string", "pattern": "a"}, {"type": "string", "pattern": "b"}], "maxLength": 3},
     ["ab", "bxa"], ["aa", "abcd"]),
    ({"oneOf": [{"type": "string", "maxLength": 1}, {"type": "integer", "minimum": 0, "maximum": 3}]},
     ["", "x", 0, 3], ["xy", 4, None]),
    ({"type": ["string", "integer", "null"], "not": {"type": "null"}}, ["a", 3], [None]),
    (dict(DEFS, type="array", items={"$ref": "#/$defs/small"}, maxItems=2), [[], [0, 9]], [[10], [1, 2, 3]]),
    (dict(DEFS, **{"$ref": "#/$defs/small", "minimum": 5}), [5, 9], [4, 10]),
    ({"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}], "items": False},
     [[], [True], [False, None]], [[True, None, 1], [None]]),
    ({"type": "array", "prefixItems": [{"type": "boolean"}], "items": {"type": "integer"}, "minItems": 2,
      "maxItems": 3}, [[True, 1], [False, 1, 2]], [[True], [True, 1, 2, 3], [1, 1]]),
    ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 1}, "minItems": 1},
     [[0], [1, 0, 1]], [[], [2]]),
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                       "b": {"type": ["boolean", "null"]}}, "required": ["a"],
      "additionalProperties": False},
     [{"a": 1}, {"a": 2, "b": None}, {"b": True, "a": 0}], [{"b": True}, {"a": 1, "c": 2}, {"a": 10}]),
    ({"type": "number"}, [0, -1.5, 2e10, 3], ["1"]),
    ({"type": "number", "minimum": 0, "exclusiveMaximum": 10}, [0, 0.5, 9.999, 3, 9], [10, 10.5, -0.1, -1]),
    ({"type": "number", "exclusiveMinimum": -2, "maximum": 1}, [-1.5, -1, 0, 1, 0.25, -1.999], [-2, -2.5, 1.01, 2]),
    ({"type": "number", "maximum": -3}, [-3, -3.5, -100.25], [-2.9, 0, 3]),
    ({"type": "number", "exclusiveMinimum": 0}, [0.001, 1, 7.5], [0, -0.5]),
    ({"type": "number", "multipleOf": 5, "minimum": 0}, [0, 5, 100], [2.5, 3, -5]),
    ({"type": "number", "minimum": 0.5, "maximum": 2.25}, [0.5, 1, 2, 2.25, 2.2, 0.75, 0.5001, 1.999],
     [0.49, 0.4999, 2.26, 2.251, 3, 0, -1, -0.5]),
    ({"type": "number", "exclusiveMinimum": 0.1, "exclusiveMaximum": 0.3}, [0.2, 0.10000000000000002, 0.29999999999999993, 0.15],
     [0.1, 0.3, 0.30000000000000004, 0.05, 1]),
    ({"type": "number", "minimum": -1.75, "maximum": -1.5}, [-1.5, -1.75, -1.6, -1.7499], [-1.4, -1.76, -2, 1.6, 0]),
    ({"type": "number", "minimum": -0.25, "exclusiveMaximum": 0.125}, [-0.25, -0.1, 0, 0.1, 0.12, 0.124999],
     [-0.26, 0.125, 0.13, 1, -1]),
    ({"type": "number", "exclusiveMinimum": 3.14159}, [3.1416, 3.2, 4, 100.5, 3.14159000001], [3.14159, 3.14, 3, -4]),
    ({"type": "number", "maximum": 0.001}, [0.001, 0.0009, 0, -5, -0.5], [0.0011, 0.01, 1]),
    ({"type": "integer", "minimum": 0.5, "exclusiveMaximum": 3.5}, [1, 2, 3], [0, 4]),
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
      "additionalProperties": {"type": "boolean"}},
     [{}, {"a": 1}, {"x": True}, {"x": False, "a": 2, "y": True}, {"ab": True}, {"é": False}],
     [{"x": 1}, {"a": True}, {"a": 10}, {"x": None, "a": 1}]),
    ({"type": "object", "additionalProperties": {"type": "null"}, "minProperties": 1, "maxProperties": 2},
     [{"k": None}, {"k": None, "j": None}], [{}, {"a": None, "b": None, "c": None}, {"a": 1}]),
    ({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}, "c": {"type": "null"}},
      "minProperties": 2, "maxProperties": 2},
     [{"a": None, "b": None}, {"c": None, "a": None}], [{"a": None}, {"a": None, "b": None, "c": None}, {}]),
    ({"type": "object", "properties": {"a": {"type": "null"}}, "required": ["a"], "minProperties": 2,
      "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 3}},
     [{"a": None, "n": 0}, {"m": 3, "a": None, "n": 1}], [{"a": None}, {"n": 1, "m": 2}, {"a": None, "n": 4}]),
    ({"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}},
      "patternProperties": {"^x_": {"type": "boolean"}, "^i": {"type": "integer", "minimum": 5}},
      "additionalProperties": {"type": "null"}},
     [{"x_a": True}, {"id": 7}, {"ix": 5}, {"y": None}, {"x_": False, "y": None, "id": 50}],
     [{"x_a": 1}, {"id": 3}, {"ix": 4}, {"y": 1}, {"x_a": None}]),          # "id" matches "^i": both apply
    ({"type": "object", "patternProperties": {"[0-9]": {"type": "string", "maxLength": 1}}, "maxProperties": 2,
      "additionalProperties": False},
     [{}, {"a1": "x"}, {"1": "", "2b": "y"}], [{"a": "x"}, {"1": "xy"}, {"1": "a", "2": "b", "3": "c"}]),
]


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


def _time(s: str) -> None:        # RFC 3339 full-time: an offset is required
    _require(re.fullmatch(r".*(Z|[+-]\d\d:\d\d)", s) is not None and len(s.split(":")[0]) == 2, s)
    datetime.time.fromisoformat(s.replace("Z", "+00:00"))


FORMAT_CHECKS = {                  # independent checks: Python's parsers plus RFC 3339's / RFC 4122's shape
    "date": lambda s: _require(len(s) == 10, s) or datetime.date.fromisoformat(s),
    "time": _time,
    "date-time": lambda s: _require("T" in s, s) or (datetime.date.fromisoformat(s.split("T")[0]), _time(s.split("T")[1])),
    "email": lambda s: _require(s.count("@") == 1 and "." in s.split("@")[1] and s.split("@")[0] != "", s),
    "uuid": lambda s: _require(len(s) == 36 and s.count("-") == 4, s) or uuid.UUID(s),
    "ipv4": lambda s: ipaddress.IPv4Address(s),
}


def validate(value, schema):
    jsonschema.validate(value, schema)
    fmt = schema.get("format")
    if fmt:
        FORMAT_CHECKS[fmt](value)


def walks(dfa, n: int, rng: random.Random, max_len: int = 40):
    """Random texts of the language: walk live bytes (stopping at an accepting state with prob. 1/3);
    after ``max_len`` bytes, head for the nearest accepting state."""
    import numpy as np
    dist = np.where(dfa.accepting, 0, 10 ** 9)
    for _ in range(dfa.num_states):                     # Bellman-Ford on bytes: fewest bytes to accept
        t = dfa.transitions
        nxt = np.where(t >= 0, dist[np.maximum(t, 0)], 10 ** 9).min(axis=1) + 1
        new = np.minimum(dist, nxt)
        if (new == dist).all():
            break
        dist = new
    out = []
    for _ in range(n):
        state, data = 0, bytearray()
        while True:
            if dfa.accepting[state] and (rng.random() < 0.33 or not (dfa.transitions[state] >= 0).any()
                                         or len(data) >= max_len):      # long enough: stop where it may
                break
            live = [b for b in range(256) if dfa.transitions[state, b] >= 0]
            if len(data) >= max_len:
                live = [b for b in live if dist[dfa.transitions[state, b]] < dist[state]]
            b = rng.choice(live)
            data.append(b)
            state = int(dfa.transitions[state, b])
        out.append(data.decode())
    return out


@pytest.mark.parametrize("schema, valid, invalid", CASES, ids=[json.dumps(c[0])[:50] for c in CASES])
def test_keyword_is_exact_on_its_cases_and_sound_on_random_walks(schema, valid, invalid):
    dfa = compile_tree(schema_to_tree(schema))
    for v in valid:
        validate(v, schema)                                 # the case list itself is right
        assert dfa.matches(compact(v)), f"valid {compact(v)} refused"
    for v in invalid:
        with pytest.raises((jsonschema.ValidationError, ValueError)):
            validate(v, schema)
        assert not dfa.matches(compact(v)), f"invalid {compact(v)} accepted"
    texts = walks(dfa, 150, random.Random(0))
    assert len(texts) >= 50
    for t in texts:
        validate(json.loads(t), schema)


def test_boolean_operations_on_automata():
    digits = compile_tree(schema_to_tree({"type": "integer", "minimum": 0, "maximum": 99}))
    evens = compile_tree(schema_to_tree({"type": "integer", "multipleOf": 2}))
    both = intersect(digits, evens)
    assert both.matches("42") and not both.matches("43") and not both.matches("100")
    odd = complement(evens, within=digits)
    assert odd.matches("43") and not odd.matches("42")
    assert disjoint(both, odd) and not disjoint(digits, evens)


def test_unknown_regex_escapes_and_empty_classes_are_refused():
    from labsupport.structured import parse_regex
    for bad in (r"\q", r"\e", r"\G", "[^]", "[]", r"\N{DASH}"):
        with pytest.raises(ValueError, match="regex"):
            parse_regex(bad)
    assert compile_tree(parse_regex(r"\U0001F600")).matches("😀")
    assert compile_tree(parse_regex("[]a]")).matches("]")
    assert compile_tree(parse_regex(r"\a")).matches("\a")


def test_side_by_side_cases_are_invalid_and_ours_never_accepts_them():
    from labsupport.structured.peer import CASES, compare
    for label, schema, invalid in CASES:
        if "uniqueItems" in schema or "format" in schema:
            continue                                   # jsonschema does not check these without extras
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(invalid, schema)
    rows = compare()
    assert len(rows) == len(CASES) and not any(r.ours.startswith("ACCEPTS") for r in rows)
    assert sum(r.ours.startswith("refuses") for r in rows) >= 2


@pytest.mark.parametrize("schema, text, valid, ours", [
    ({"type": "number", "exclusiveMinimum": 1}, "1.00000000000000001", False, False),     # parses to 1.0
    ({"type": "number", "exclusiveMinimum": 1}, "1.0000000000000003", True, True),
    ({"type": "number", "exclusiveMaximum": 0.3}, "0.29999999999999998", False, False),   # parses to 0.3
    ({"type": "number", "exclusiveMaximum": 0.3}, "0.2999999999999999", True, True),
    ({"type": "number", "maximum": 0.3}, "0.30000000000000001", True, False),   # valid (0.3), not compact: refused
    ({"type": "number", "minimum": 2.5}, "2.50", True, True),
    ({"type": "number", "minimum": 2.5}, "2.49999", False, False),
])
def test_number_bounds_are_judged_on_the_parsed_float(schema, text, valid, ours):
    """Validators compare the parsed float: a text between a strict bound and the next float parses
    to the bound itself and is invalid, and the automaton refuses it; a long text that only rounds
    onto a bound is refused too (the digits decide; soundness never depends on rounding)."""
    dfa = compile_tree(schema_to_tree(schema))
    assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)) is valid
    assert dfa.matches(text) is ours
    assert valid or not ours


@pytest.mark.parametrize("schema, error, message", [
    ({"type": "integer", "minimum": 5, "exclusiveMaximum": 5}, ValueError,
     r"'exclusiveMaximum' at /: leaves no integer: with minimum 5 and exclusiveMaximum 5"),
    ({"type": "number", "exclusiveMinimum": 2.5, "maximum": 2.5}, ValueError,
     r"'maximum' at /: leaves no number: exclusiveMinimum is 2.5 and maximum is 2.5"),
    ({"type": "number", "minimum": "3"}, TypeError, r"'minimum' at /: must be a number .* got '3' \(str\)"),
    ({"type": "integer", "maximum": float("inf")}, ValueError, r"'maximum' at /: must be a number .* got inf"),
    ({"type": "string", "maxLength": "9"}, TypeError, r"'maxLength' at /: must be an integer in \[0, 1000\]"),
    ({"type": "string", "maxLength": 1001}, ValueError, r"'maxLength' at /: must be an integer in \[0, 1000\]"),
    ({"type": "integer", "multipleOf": "2"}, TypeError, r"'multipleOf' at /: must be an integer .* \(str\)"),
    ({"type": "number", "multipleOf": True}, TypeError, r"'multipleOf' at /: must be a number, got True"),
    ({"type": "number", "multipleOf": 10 ** 400}, ValueError, r"'multipleOf' at /: must be an integer in \[1, 10000\]"),
    # the product is too large: said so, not relabelled as "no multiple within the bounds"
    ({"type": "integer", "multipleOf": 9999, "minimum": 0, "maximum": 10 ** 12}, ValueError,
     r"'multipleOf' at /: grammar too large"),
])
def test_bad_bounds_name_the_keyword_and_the_error_kind(schema, error, message):
    with pytest.raises(error, match=message):
        schema_to_tree(schema)


def test_numpy_numbers_are_numbers_in_bounds():
    import numpy as np
    dfa = compile_tree(schema_to_tree({"type": "integer", "minimum": np.int64(3), "maximum": np.float32(5.0),
                                       "multipleOf": np.int64(2)}))
    assert [i for i in range(10) if dfa.matches(str(i))] == [4]


def test_disjointness_is_proven_only_by_an_empty_product(monkeypatch):
    """Only an empty intersection proves two languages disjoint: a product too large to search
    says so, it is not taken as "disjoint" (oneOf and patternProperties rely on the answer)."""
    from labsupport.structured import automaton
    from labsupport.structured.regex import parse_regex
    a, b = compile_tree(parse_regex("[a-z]{3,9}")), compile_tree(parse_regex("[a-m]{2,8}"))
    assert automaton.disjoint(a, compile_tree(parse_regex("[0-9]+"))) is True
    assert automaton.disjoint(a, b) is False
    monkeypatch.setattr(automaton, "MAX_PRODUCT_STATES", 3)
    with pytest.raises(ValueError, match="grammar too large") as err:
        automaton.disjoint(a, b)
    assert not isinstance(err.value, automaton.EmptyLanguageError)
