"""Side by side with XGrammar (Dong et al., 2024), the grammar engine inside vLLM and SGLang: the
same schemas through both compilers, and for each an instance that is **invalid** — does the
compiled grammar still accept it?

Ours either compiles a keyword exactly or refuses it; XGrammar compiles more schemas and, where
it cannot be exact, falls back to looser semantics (with a warning on stderr, which
:func:`captured_native_stderr` keeps in :data:`XGRAMMAR_WARNINGS` instead of the notebook): ``oneOf``
as ``anyOf``, ``allOf`` partly, ``not`` and some type filters ignored. The table makes that trade
visible. XGrammar is optional: without it, its column says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from ..i18n import N_, tr, tr_marked
from .automaton import compile_tree
from .json_schema import schema_to_tree

#: What XGrammar's C++ side wrote to stderr while it compiled (its fall-back warnings), newest last.
XGRAMMAR_WARNINGS: list[str] = []


@contextlib.contextmanager
def captured_native_stderr() -> Iterator[list[str]]:
    """Catch what native code writes to file descriptor 2 (XGrammar's C++ warnings, which a notebook
    would show as a red stderr box mid-lesson) into the yielded list, one entry per line, and append
    them to :data:`XGRAMMAR_WARNINGS`. Python's own ``sys.stderr`` is untouched."""
    lines: list[str] = []
    try:
        fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else 2
        saved = os.dup(fd)
    except (OSError, ValueError, AttributeError):        # no real descriptor 2 here: nothing to catch
        yield lines
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield lines
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            lines += [line for line in sink.read().decode("utf-8", "replace").splitlines() if line.strip()]
            XGRAMMAR_WARNINGS.extend(lines)


#: (label, schema, an invalid instance) — each instance violates the schema it sits beside.
CASES = [
    (N_("enum filtered by type"), {"type": "string", "enum": ["a", 1]}, 1),
    (N_("allOf of two bounds"), {"allOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 5}]}, 7),
    (N_("not a constant"), {"type": "string", "not": {"const": "a"}}, "a"),
    (N_("overlapping oneOf"), {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, "ab"),
    (N_("date on Feb 29 of 2023"), {"type": "string", "format": "date"}, "2023-02-29"),
    (N_("multipleOf"), {"type": "integer", "multipleOf": 7}, 8),
    (N_("exclusiveMaximum"), {"type": "integer", "exclusiveMaximum": 10}, 10),
    (N_("anchored pattern"), {"type": "string", "pattern": "^ab+$"}, "xab"),
    (N_("uniqueItems"), {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1]),
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

    @property
    def label_shown(self) -> str:
        """:attr:`label` in the reader's language (:mod:`labsupport.i18n`)."""
        return tr_marked(self.label)

    @property
    def ours_shown(self) -> str:
        """:attr:`ours` in the reader's language."""
        return _shown(self.ours)

    @property
    def xgrammar_shown(self) -> str:
        """:attr:`xgrammar` in the reader's language."""
        return _shown(self.xgrammar)


def _shown(verdict: str) -> str:
    """A verdict of :func:`compare` (English: the code tests its first word) as the reader reads it."""
    if verdict.startswith("refuses the schema ("):
        return tr("refuses the schema ({why})", why=verdict[len("refuses the schema ("):-1])
    return {"ACCEPTS the invalid instance": tr("ACCEPTS the invalid instance"), "rejects it": tr("rejects it"),
            "not installed": tr("not installed")}.get(verdict, verdict)


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
                with captured_native_stderr():
                    grammar = xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
                peer = "ACCEPTS the invalid instance" if _is_grammar_accept_string(grammar, text) else "rejects it"
            except Exception as err:                 # noqa: BLE001 - any refusal of the peer is a table entry
                peer = f"refuses the schema ({type(err).__name__})"
        rows.append(PeerRow(label, schema, invalid, ours, peer))
    return rows
