"""JSON arrays and objects for :mod:`.json_schema`: items and lengths, members in any order, other keys.

The compiler's container half (a mixin of its ``_Compiler``): ``_array`` (``items``,
``prefixItems``, ``minItems`` / ``maxItems``), ``_object`` (``properties``, ``required``,
``additionalProperties``, ``patternProperties``, ``minProperties`` / ``maxProperties``) and, for the
pushdown path, any JSON value as a rule that refers to itself. Keys other than the listed ones are
written as plain strings — no escapes — so a key's text is its value, and automaton differences
keep them apart from the listed names and from each pattern's keys.
"""

from __future__ import annotations

import json

from .automaton import EmptyLanguageError, Machine, compile_tree, difference, disjoint, intersect
from .json_values import BOOLEAN, NULL, STRING_CHAR, bad, length_range, number_tree, string_tree
from .regex import Alt, Keys, RawByte, Repeat, Seq, literal


def value_literal(value) -> Seq:
    """A JSON value written compactly (``json.dumps`` with ``,`` and ``:`` separators)."""
    try:
        return literal(json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ValueError(f"enum / const values must be JSON values, got {value!r}") from err


class Containers:
    """``_array`` / ``_object`` / ``_any_value`` of the schema compiler (which gives ``tree``, ``ws``,
    ``any_order`` and ``_symbol``)."""

    def _any_value(self) -> RawByte:
        """Any JSON value (``true``): a rule that refers to itself for the members and items."""
        def body():
            ws, v = self.ws, RawByte(self.codes["$any"])
            member = Seq((string_tree({}, ""), ws, literal(":"), ws, v))
            obj = Seq((literal("{"), ws, Repeat(Seq((member, Repeat(Seq((ws, literal(","), ws, member)), 0, None))),
                                                 0, 1), ws, literal("}")))
            arr = Seq((literal("["), ws, Repeat(Seq((v, Repeat(Seq((ws, literal(","), ws, v)), 0, None))), 0, 1),
                       ws, literal("]")))
            return Alt((obj, arr, string_tree({}, ""), number_tree({}, ""), BOOLEAN, NULL))
        return self._symbol("$any", body)

    def _array(self, schema: dict, path: str, refs: tuple):
        ws = self.ws
        prefix = schema.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise bad(path, "prefixItems", f"must be a list of schemas, got {prefix!r}")
        firsts = [self.tree(s, f"{path}/prefixItems/{i}", refs) for i, s in enumerate(prefix)]
        items = schema.get("items")
        if items is None and not prefix:
            raise bad(path, "items", "is required for arrays here (a schema for every item; without it any "
                      "JSON value would be allowed, which needs a stack)")
        if items is None:
            raise bad(path, "items", "is required after prefixItems here (false: no more items, or a schema)")
        item = None if items is False else self.tree(items, f"{path}/items", refs)
        low, high = length_range(schema, path, "minItems", "maxItems")
        options = []
        most = len(firsts) if item is None else (None if high is None else high)
        for n in range(low, len(firsts) + 1):                # arrays no longer than the prefix
            if high is not None and n > high:
                break
            if n == len(firsts) and item is not None and (high is None or high > n):
                continue                                      # covered by the open case below
            body = [firsts[0]] + [Seq((ws, literal(","), ws, f)) for f in firsts[1:n]] if n else []
            options.append(Seq((literal("["), ws, *body, ws, literal("]"))) if n else Seq((literal("["), ws, literal("]"))))
        if item is not None and (most is None or most >= len(firsts)):
            extra_low = max(low - len(firsts), 0)
            extra_high = None if high is None else high - len(firsts)
            if extra_high is None or extra_high >= max(extra_low, 0):
                if firsts:
                    body = [firsts[0]] + [Seq((ws, literal(","), ws, f)) for f in firsts[1:]]
                    more = Repeat(Seq((ws, literal(","), ws, item)), extra_low, extra_high)
                    options.append(Seq((literal("["), ws, *body, more, ws, literal("]"))))
                else:
                    rest = Repeat(Seq((ws, literal(","), ws, item)), max(extra_low - 1, 0),
                                  None if extra_high is None else max(extra_high - 1, 0))
                    if extra_high is None or extra_high >= 1:
                        options.append(Seq((literal("["), ws, item, rest, ws, literal("]"))))
                    if extra_low == 0:
                        options.append(Seq((literal("["), ws, literal("]"))))
        if not options:
            raise bad(path, "minItems", "no array length satisfies the bounds with these items")
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def _object(self, schema: dict, path: str, refs: tuple):
        ws = self.ws
        props = schema.get("properties", {})
        if not isinstance(props, dict):
            raise bad(path, "properties", f"must be a dict of name -> schema, got {props!r}")
        required = schema.get("required", [])
        if not isinstance(required, list) or any(not isinstance(r, str) for r in required):
            raise bad(path, "required", f"must be a list of property names, got {required!r}")
        missing = [r for r in required if r not in props]
        if missing:
            raise bad(path, "required", f"names {missing[0]!r}, which is not in properties (additional "
                      "properties are not written here)")
        if len(set(required)) != len(required):
            raise bad(path, "required", f"lists a name twice: {required!r}")
        additional = schema.get("additionalProperties", False)
        if additional is True:
            raise bad(path, "additionalProperties", "true (any key with any JSON value) needs a stack: give a "
                      "schema for the values of the other keys, or false")
        patterns = _pattern_keys(schema.get("patternProperties", {}), list(props), path)
        others = [Seq((Machine(keys), ws, literal(":"), ws, self.tree(sub, f"{path}/patternProperties/{p}", refs)))
                  for p, keys, _, sub in patterns]
        if additional is not False:
            rest = _other_key(list(props), [m for _, _, m, _ in patterns])
            if rest is not None:
                value = self.tree(additional, f"{path}/additionalProperties", refs)
                others.append(Seq((rest, ws, literal(":"), ws, value)))
        extra = None if not others else others[0] if len(others) == 1 else Alt(tuple(others))
        low, high = length_range(schema, path, "minProperties", "maxProperties")
        if extra is None and low > len(props):
            raise bad(path, "minProperties", f"asks for {low} keys, but only the {len(props)} of properties can "
                      "be written (additionalProperties is false)")
        for name in props:                       # a listed key that a pattern matches obeys both schemas
            also = [sub for _, _, matcher, sub in patterns if matcher.matches(json.dumps(name, ensure_ascii=False))]
            if also:
                props = dict(props, **{name: {"allOf": [props[name], *also]}})
        members = []
        for name, sub in props.items():
            value = self.tree(sub, f"{path}/properties/{name}", refs)
            members.append((name, Seq((value_literal(name), ws, literal(":"), ws, value)), name in required))
        if high is not None and high < len(required):
            raise bad(path, "maxProperties", f"is {high}, below the {len(required)} required keys")
        return Keys(members=tuple(members), any_order=self.any_order, open=literal("{"), first=ws,
                    sep=Seq((ws, literal(","), ws)), close=Seq((ws, literal("}"))), extra=extra,
                    min_count=low, max_count=high)


#: A key of ``additionalProperties``: a JSON string written without escapes, so its text is its
#: value, and a text that differs from every listed name's is a key that differs from every name.
_PLAIN_KEY = Seq((literal('"'), Repeat(STRING_CHAR.options[0], 0, None), literal('"')))


def _names(names: list[str]):
    """The listed property names' JSON texts as one automaton, or None when there are none."""
    return compile_tree(Alt(tuple(value_literal(n) for n in names))) if names else None


def _pattern_keys(patterns, names: list[str], path: str) -> list:
    """``patternProperties`` as ``(pattern, keys DFA, matcher DFA, schema)``: the keys are the plain
    strings the pattern finds (a search) that are not listed names; the matcher, the JSON strings the
    pattern finds (to tell which listed names it also covers). Patterns whose keys overlap are refused:
    such a key would have to satisfy both schemas at once."""
    if not isinstance(patterns, dict):
        raise bad(path, "patternProperties", f"must be a dict of pattern -> schema, got {patterns!r}")
    if not patterns:
        return []
    if any("\\" in json.dumps(n, ensure_ascii=False) for n in names):
        raise bad(path, "patternProperties", "is not combined with property names that need escapes")
    plain, listed = compile_tree(_PLAIN_KEY), _names(names)      # once for every pattern
    out = []
    for pattern, sub in patterns.items():
        matcher = compile_tree(string_tree({"type": "string", "pattern": pattern}, f"{path}/patternProperties"))
        try:
            keys = intersect(plain, matcher)
            if listed is not None:
                keys = difference(keys, listed)
        except EmptyLanguageError:
            continue                                   # the pattern adds no key beyond the listed ones
        for other, other_keys, _, _ in out:
            if not disjoint(keys, other_keys):
                raise bad(path, "patternProperties", f"patterns {other!r} and {pattern!r} can match the same key, "
                          "which would then have to satisfy both schemas; refused (use one pattern)")
        out.append((pattern, keys, matcher, sub))
    return out


def _other_key(names: list[str], matchers: list) -> Machine | None:
    """Any plain JSON string except the listed names and the keys a pattern finds (automaton
    differences); None when nothing is left."""
    keys = compile_tree(_PLAIN_KEY)
    listed = _names(names)
    try:
        for taken in ([listed] if listed is not None else []) + matchers:
            keys = difference(keys, taken)
    except EmptyLanguageError:
        return None
    return Machine(keys)
