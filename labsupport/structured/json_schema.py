"""JSON Schema (draft 2020-12) → grammar tree (then :func:`~.automaton.compile_tree` → DFA).

Every keyword compiled here is **sound** — no text the automaton allows is an invalid instance —
and what cannot be compiled exactly is refused with a ``ValueError`` naming the keyword and its
path, never ignored:

================  ======================================================================
``type``          one type or a list; keywords apply only to instances of their own type
``enum``/``const`` any JSON values, written compactly, filtered by ``type`` (a value of another
                  type can never validate); combined with the other keywords by intersection
object            ``properties``, ``required`` (any order by default, each key once),
                  ``additionalProperties``: ``false`` (the default here: no other keys are
                  written) or a schema for the values of other keys, which are written as plain
                  strings (no escapes, so a key's text is its value and differs from every listed
                  name — an automaton difference); ``true`` (any value) needs a stack: refused;
                  ``patternProperties`` (keys the pattern finds, as plain strings; a listed
                  key it finds obeys both schemas; patterns that can find the same key refused);
                  ``minProperties`` / ``maxProperties`` (the member count is part of the hub state)
array             ``items`` (a schema, or ``false`` after ``prefixItems``), ``prefixItems``,
                  ``minItems``, ``maxItems``
integer           ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum`` (either
                  side may be open), ``multipleOf`` (a remainder automaton)
number            the same bounds, whole or fractional (the plain numerals ``I`` and ``I.F`` in
                  range, no exponent; the fraction compared digit by digit); an integer
                  ``multipleOf`` (integers only); a fractional ``multipleOf`` is refused
string            ``minLength``, ``maxLength``, ``pattern`` (a *search*, as the spec says),
                  ``format``: date, time, date-time, email, uuid, ipv4 — all at once
``anyOf``         the union of the branches
``allOf``         the intersection of the branches' automata (a product construction)
``oneOf``         exact only when the branches cannot share a value: branches of pairwise
                  disjoint types; refused otherwise (never silently ``anyOf``)
``not``           ``not: {type: …}`` removes types from the schema's own; refused otherwise
``$ref``          local references (``#/$defs/…``, ``#/definitions/…``, ``#``), inlined;
                  a recursive reference is refused (it needs a stack)
boolean schemas   ``false`` matches nothing (refused: nothing to generate); ``true`` (any JSON
                  value) needs a stack: refused
================  ======================================================================

Why ``not`` and ``oneOf`` are limited although an automaton complements as easily as it
intersects: the automaton works on **texts** and JSON Schema on **values**, and one value has
many texts (``"a"`` and ``"\\u0061"``; ``1`` and ``1.0``, an integer in JSON Schema). The text
complement of ``{"const": "a"}`` contains ``"\\u0061"`` — the value ``"a"``. Intersection and
union are safe (a text in both languages is valid for both); complement is not, so it is used
only where types decide it.

Whitespace: with ``whitespace=0`` none at all (compact ``{"a":1,"b":2}``); with ``whitespace=k``
up to ``k`` of ``[ \\n\\r\\t]`` around every ``{ } [ ] , :`` — XGrammar's ``max_whitespace_cnt=k``.
Scalars (strings, integers, formats) are built in :mod:`.json_values`.
"""

from __future__ import annotations

from .automaton import EmptyLanguageError, Machine, compile_tree, intersect
from .ebnf import SYMBOL_BYTES
from .json_containers import Containers, value_literal
from .json_values import (
    BOOLEAN,
    NULL,
    bad,
    integer_range,  # noqa: F401  (re-exported)
    integer_tree,
    number_tree,
    string_tree,
)
from .regex import EMPTY, MAX_NESTING, Alt, RawByte, Repeat, chars, nesting_error

ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "$defs",
               "definitions", "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding"}
TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties", "patternProperties", "minProperties",
               "maxProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "boolean": set(), "null": set(),
}
TYPES = tuple(TYPE_KEYWORDS)
VALUE_KEYWORDS = {"enum", "const"}
COMBINATORS = ("allOf", "anyOf", "oneOf", "not")
KNOWN = set().union(*TYPE_KEYWORDS.values()) | VALUE_KEYWORDS | set(COMBINATORS) | {"type", "$ref"}


def _ws(whitespace: int):
    return Repeat(chars(" \\n\\r\\t"), 0, whitespace) if whitespace else EMPTY


def json_type(value) -> set[str]:
    """The JSON Schema types of a Python JSON value (``1.0`` is an integer *and* a number)."""
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, str):
        return {"string"}
    if isinstance(value, list):
        return {"array"}
    if isinstance(value, dict):
        return {"object"}
    return set()


def _types_of(schema: dict, path: str) -> list[str] | None:
    """The schema's ``type`` as a list (``None`` when absent)."""
    if "type" not in schema:
        return None
    kind = schema["type"]
    kinds = kind if isinstance(kind, list) else [kind]
    if not kinds or any(not isinstance(k, str) or k not in TYPE_KEYWORDS for k in kinds) or len(set(kinds)) != len(kinds):
        raise bad(path, "type", f"must be one of {sorted(TYPE_KEYWORDS)} or a non-empty list of them without "
                  f"repeats, got {kind!r}")
    return list(kinds)


def _branch_types(schema, path: str) -> set[str] | None:
    """The types a branch's instances can have, when its ``type`` / ``enum`` / ``const`` says so."""
    if isinstance(schema, dict):
        kinds = _types_of(schema, path)
        if "const" in schema:
            return json_type(schema["const"])
        if "enum" in schema and isinstance(schema["enum"], list):
            return set().union(*(json_type(v) for v in schema["enum"])) if schema["enum"] else set()
        if kinds is not None:
            return set(kinds) | ({"number"} if "integer" in kinds else set()) | \
                ({"integer"} if "number" in kinds else set())
    return None


class _Compiler(Containers):
    def __init__(self, root, whitespace: int, any_order: bool, stack: bool = False) -> None:
        self.root, self.whitespace, self.any_order = root, whitespace, any_order
        self.ws = _ws(whitespace)
        self.stack = stack                  # a pushdown matcher will run it: recursion becomes rule symbols
        self.rules: dict[str, object] = {}  # rule name -> tree (filled when stack is True)
        self.codes: dict[str, int] = {}

    def _symbol(self, name: str, body) -> RawByte:
        """The symbol of rule ``name`` (its tree built once, by ``body()``, when first met)."""
        if name not in self.codes:
            if len(self.codes) + 1 >= len(SYMBOL_BYTES):
                raise bad("", "$ref", f"more than {len(SYMBOL_BYTES) - 1} recursive references need a stack")
            self.codes[name] = SYMBOL_BYTES[len(self.codes) + 1]      # SYMBOL_BYTES[0] is the root's
            self.rules[name] = None
            self.rules[name] = body()
        return RawByte(self.codes[name])

    # ------------------------------------------------------------------ dispatch
    def tree(self, schema, path: str, refs: tuple = ()):
        """``schema``'s grammar tree; subschemas (``$ref`` chains included) nest at most
        :data:`~.regex.MAX_NESTING` deep."""
        self.depth = getattr(self, "depth", 0) + 1
        try:
            if self.depth > MAX_NESTING:
                raise nesting_error(f"JSON Schema subschemas (at {path or '#'}, $ref chains included)")
            return self._tree(schema, path, refs)
        finally:
            self.depth -= 1

    def _tree(self, schema, path: str, refs: tuple = ()):
        if schema is True and self.stack:
            return self._any_value()
        if schema is True:
            raise bad(path, "true", "accepts any JSON value, whose nesting has no bound: that needs a stack "
                      "(a context-free grammar), not an automaton; give the value a schema")
        if schema is False:
            raise bad(path, "false", "accepts no value at all: there is nothing to generate")
        if not isinstance(schema, dict):
            raise TypeError(f"schema at {path or '/'} must be a dict or a bool, got {type(schema).__name__}")
        unknown = sorted(set(schema) - ANNOTATIONS - KNOWN)
        if unknown:
            raise bad(path, unknown[0], "is not supported (it is refused rather than ignored, so no invalid "
                      "instance can pass)")
        if "$ref" in schema:
            return self._ref(schema, path, refs)
        if any(k in schema for k in COMBINATORS):
            return self._combined(schema, path, refs)
        kinds = _types_of(schema, path)
        if VALUE_KEYWORDS & set(schema):
            return self._values(schema, kinds, path, refs)
        if kinds is None:
            constraints = sorted(set(schema) - ANNOTATIONS)
            raise bad(path, constraints[0] if constraints else "type",
                      "needs a 'type' here (without one any JSON value would be allowed, which needs a stack)"
                      if constraints else "is required (or enum / const / anyOf / $ref): a schema without it "
                      "accepts any JSON value, which needs a stack")
        extra = set(schema) - ANNOTATIONS - {"type"} - set().union(*(TYPE_KEYWORDS[k] for k in kinds))
        if extra:
            raise bad(path, min(extra), f"does not apply to type {kinds if len(kinds) > 1 else kinds[0]!r} "
                      f"(supported: {sorted(set().union(*(TYPE_KEYWORDS[k] for k in kinds))) or 'none'})")
        options = [self._typed(k, {kw: v for kw, v in schema.items() if kw in TYPE_KEYWORDS[k]}, path, refs)
                   for k in kinds]
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def _typed(self, kind: str, schema: dict, path: str, refs: tuple):
        if kind == "integer":
            return integer_tree(schema, path)
        if kind == "number":
            return number_tree(schema, path)
        if kind == "boolean":
            return BOOLEAN
        if kind == "null":
            return NULL
        if kind == "string":
            return string_tree(schema, path)
        if kind == "array":
            return self._array(schema, path, refs)
        return self._object(schema, path, refs)

    # ------------------------------------------------------------------ enum / const
    def _values(self, schema: dict, kinds, path: str, refs: tuple):
        if "const" in schema and "enum" in schema:
            raise bad(path, "const", "together with enum: give one of them")
        key = "const" if "const" in schema else "enum"
        values = [schema["const"]] if key == "const" else schema["enum"]
        if not isinstance(values, list) or not values:
            raise bad(path, "enum", f"must be a non-empty list, got {values!r}")
        if kinds is not None:
            values = [v for v in values if json_type(v) & set(kinds)]
            if not values:
                raise bad(path, key, f"has no value of type {kinds}: no instance can be valid")
        tree = Alt(tuple(value_literal(v) for v in values)) if len(values) > 1 else value_literal(values[0])
        rest = {k: v for k, v in schema.items() if k not in VALUE_KEYWORDS}
        if not set(rest) - ANNOTATIONS - {"type"}:
            return tree
        if kinds is None:                                        # the others constrain only their own types
            kinds = sorted(set().union(*(json_type(v) for v in values)) & set(TYPES))
            rest["type"] = [k for k in kinds if k != "number" or "integer" not in kinds]
        try:
            return Machine(intersect(compile_tree(tree), compile_tree(self.tree(rest, path, refs))))
        except EmptyLanguageError:
            raise bad(path, key, "no listed value satisfies the schema's other keywords") from None

    # ------------------------------------------------------------------ $ref
    def _ref(self, schema: dict, path: str, refs: tuple):
        ref = schema["$ref"]
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise bad(path, "$ref", f"only local references ('#', '#/$defs/name') are supported, got {ref!r}")
        target = self._resolve(ref, path)
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        if ref in refs and self.stack and not set(rest) - ANNOTATIONS:
            return self._symbol(ref, lambda: self.tree(target, ref, (ref,)))
        if ref in refs or ref in self.codes:
            raise bad(path, "$ref", f"{ref!r} refers to itself through {' → '.join(refs + (ref,))}: a recursive "
                      "schema needs a stack (a context-free grammar), not an automaton"
                      + ("; here only a bare recursive $ref is supported (no keywords beside it)" if self.stack else
                         ""))
        if not set(rest) - ANNOTATIONS:
            return self.tree(target, ref, refs + (ref,))
        return self._combined({"allOf": [target, rest]}, path, refs + (ref,))

    def _resolve(self, ref, path: str):
        """The sub-schema a local ``$ref`` (a JSON pointer) names."""
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise bad(path, "$ref", f"only local references ('#', '#/$defs/name') are supported, got {ref!r}")
        target = self.root
        for part in ref[2:].split("/") if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise bad(path, "$ref", f"{ref!r} points at nothing in this schema")
            target = target[part]
        return target

    # ------------------------------------------------------------------ combinators
    def _atoms(self, schema, path: str, depth: int = 0) -> set[str] | None:
        """The types a schema declares (``type``, ``const``/``enum``, or its ``$ref``'s target) as atoms:
        ``integer`` → {int}, ``number`` → {int, frac}, so that ``integer ∩ number = integer``."""
        if not isinstance(schema, dict) or depth > 32:
            return None
        if "$ref" in schema and "type" not in schema and not VALUE_KEYWORDS & set(schema):
            try:
                return self._atoms(self._resolve(schema["$ref"], path), path, depth + 1)
            except ValueError:
                return None
        if VALUE_KEYWORDS & set(schema):
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if not isinstance(values, list):
                return None
            atoms = set()
            for v in values:
                t = json_type(v)
                atoms |= {"int"} if "integer" in t else ({"frac"} if "number" in t else t)
            return atoms
        if "type" in schema:
            atoms = set()
            for k in _types_of(schema, path):
                atoms |= {"int"} if k == "integer" else ({"int", "frac"} if k == "number" else {k})
            return atoms
        return None

    def _typed_like(self, schema, kinds: set[str] | None):
        """``schema`` with ``type`` set to ``kinds`` when it declares none: inside a conjunction the
        other parts already restrict the instance to those types, so this changes nothing — and a
        keyword without ``type`` then applies to the instances of its own type, as the spec says."""
        if kinds is None or not isinstance(schema, dict) or self._atoms(schema, "") is not None:
            return schema
        if not set(schema) - ANNOTATIONS - {"$defs", "definitions"}:
            return schema
        names = [t for t in TYPES if t in kinds and t not in ("integer", "number")]
        if "frac" in kinds:
            names.append("number")
        elif "int" in kinds:
            names.append("integer")
        return dict(schema, type=names)

    def _combined(self, schema: dict, path: str, refs: tuple):
        rest = {k: v for k, v in schema.items() if k not in COMBINATORS}
        conjuncts = [rest] + list(schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else [])
        declared = [d for d in (self._atoms(c, path) for c in conjuncts) if d is not None]
        context = set.intersection(*declared) if declared else None
        rest = self._typed_like(rest, context)
        if "not" in schema:
            rest = self._without(rest, schema["not"], path)
        positive = set(rest) - ANNOTATIONS
        machine = compile_tree(self.tree(rest, path, refs)) if positive else None
        for kw in ("anyOf", "oneOf", "allOf"):
            if kw not in schema:
                continue
            branches = schema[kw]
            if not isinstance(branches, list) or not branches:
                raise bad(path, kw, f"must be a non-empty list of schemas, got {branches!r}")
            branches = [self._typed_like(b, context) for b in branches]
            if kw == "oneOf":
                self._check_disjoint(branches, path)
            trees = [self.tree(b, f"{path}/{kw}/{i}", refs) for i, b in enumerate(branches)]
            parts = [compile_tree(t) for t in trees] if kw == "allOf" else [compile_tree(Alt(tuple(trees)))]
            for part in parts:
                try:
                    machine = part if machine is None else intersect(machine, part)
                except EmptyLanguageError:
                    raise bad(path, kw, "no value satisfies every part of the schema together") from None
        if machine is None:
            raise bad(path, "not", "needs a 'type' beside it (the complement within all JSON values needs a stack)")
        return Machine(machine)

    def _without(self, rest: dict, negated, path: str) -> dict:
        """``not: {type: …}``: drop those types from the schema's own ``type``."""
        if not isinstance(negated, dict) or set(negated) - ANNOTATIONS != {"type"}:
            raise bad(path, "not", "is supported as 'not: {\"type\": …}' only: the complement of other keywords "
                      "would be taken on texts, and one value has several texts (\"a\" and \"\\u0061\")")
        drop = set(_types_of(negated, f"{path}/not"))
        if "number" in drop:
            drop.add("integer")
        kinds = _types_of(rest, path)
        if kinds is None:
            raise bad(path, "not", "needs a 'type' beside it (the complement within all JSON values needs a stack)")
        left = [k for k in kinds if k not in drop]
        if not left:
            raise bad(path, "not", f"excludes every type of {kinds}: no instance can be valid")
        if "integer" in drop and "number" in left:
            raise bad(path, "not", "'not integer' within 'number' is refused: 1.0 is an integer in JSON Schema, "
                      "and a number's text does not tell")
        return dict(rest, type=left)

    def _check_disjoint(self, branches: list, path: str) -> None:
        types = [_branch_types(b, f"{path}/oneOf/{i}") for i, b in enumerate(branches)]
        for i in range(len(types)):
            for j in range(i):
                if types[i] is None or types[j] is None or types[i] & types[j]:
                    raise bad(path, "oneOf", f"branches {j} and {i} may share a value, and then exactly-one differs "
                              "from at-least-one; only branches of disjoint types are compiled (use anyOf if "
                              "overlap is fine)")

def schema_to_rules(schema, *, whitespace: int = 0, any_order: bool = True) -> tuple[list[str], dict]:
    """``schema`` as rules for the pushdown matcher (:mod:`.pushdown`): ``(names, trees)`` with the
    root first. A recursive local ``$ref`` (a tree of comments, a linked list) and ``true`` (any
    JSON value) become rules that refer to themselves; everything else is compiled as by
    :func:`schema_to_tree`. With no recursion the result is one rule, the root.

    Raises:
        TypeError, ValueError: as :func:`schema_to_tree` (a recursive ``$ref`` with keywords beside it).
    """
    compiler = _Compiler(schema, whitespace, any_order, stack=True)
    root = compiler.tree(schema, "")
    names = ["root"] + list(compiler.rules)
    return names, {"root": root, **compiler.rules}


def schema_to_tree(schema, *, whitespace: int = 0, any_order: bool = True, path: str = "", root=None):
    """Translate ``schema`` into a grammar tree.

    Args:
        schema: a JSON Schema (dict) within the keywords of the module docstring.
        whitespace: most whitespace characters allowed at each structural position (0 = none).
        any_order: object keys in any order (each once) rather than the schema's order.
        path: JSON pointer of ``schema`` inside the root (for error messages).
        root: the document ``$ref`` resolves against (default ``schema`` itself).

    Raises:
        TypeError: ``schema`` is not a dict (or a bool).
        ValueError: an unsupported keyword or type, a bad value, naming the keyword and path.
    """
    return _Compiler(schema if root is None else root, whitespace, any_order).tree(schema, path)
