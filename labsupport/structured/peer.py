"""Side by side with XGrammar (Dong et al., 2024), the grammar engine inside vLLM and SGLang: the
same schemas through both compilers, and for each an instance that is **invalid** — does the
compiled grammar still accept it?

Ours either compiles a keyword exactly or refuses it; XGrammar compiles more schemas and, where
it cannot be exact, falls back to looser semantics (with a warning on stderr): ``oneOf`` as
``anyOf``, ``allOf`` partly, ``not`` and some type filters ignored. The table makes that trade
visible. XGrammar is optional: without it, its column says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .automaton import compile_tree
from .json_schema import schema_to_tree

#: (label, schema, an invalid instance) — each instance violates the schema it sits beside.
CASES = [
    ("enum filtered by type", {"type": "string", "enum": ["a", 1]}, 1),
    ("allOf of two bounds", {"allOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 5}]}, 7),
    ("not a constant", {"type": "string", "not": {"const": "a"}}, "a"),
    ("overlapping oneOf", {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, "ab"),
    ("date on Feb 29 of 2023", {"type": "string", "format": "date"}, "2023-02-29"),
    ("multipleOf", {"type": "integer", "multipleOf": 7}, 8),
    ("exclusiveMaximum", {"type": "integer", "exclusiveMaximum": 10}, 10),
    ("anchored pattern", {"type": "string", "pattern": "^ab+$"}, "xab"),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1]),
]


@dataclass(frozen=True)
class PeerRow:
    """One schema through both compilers.

    Attributes:
        ours: ``"accepts the invalid instance"`` / ``"rejects it"`` / ``"refuses the schema: …"``.
        xgrammar: the same for XGrammar, or ``"not installed"``.
    """

    label: str
    schema: dict
    invalid: object
    ours: str
    xgrammar: str


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def compare(cases=CASES) -> list[PeerRow]:
    """Run every case through our compiler and XGrammar's (``any_whitespace=False``: compact JSON)."""
    try:
        import xgrammar as xgr
        from xgrammar.testing import _is_grammar_accept_string
    except ImportError:
        xgr = None
    rows = []
    for label, schema, invalid in cases:
        text = _compact(invalid)
        try:
            ok = compile_tree(schema_to_tree(schema)).matches(text)
            ours = "ACCEPTS the invalid instance" if ok else "rejects it"
        except ValueError as err:
            keyword = str(err).split("'")[1] if "'" in str(err) else "?"
            ours = f"refuses the schema ({keyword!r})"
        if xgr is None:
            peer = "not installed"
        else:
            try:
                grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
                peer = "ACCEPTS the invalid instance" if _is_grammar_accept_string(grammar, text) else "rejects it"
            except Exception as err:                 # noqa: BLE001 - any refusal of the peer is a table entry
                peer = f"refuses the schema ({type(err).__name__})"
        rows.append(PeerRow(label, schema, invalid, ours, peer))
    return rows
