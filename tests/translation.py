"""Maintainer tool for the Korean edition: which cells need (re-)translating, and keeping the cells in step.

    python tests/translation.py status                      # every chapter: stale, untranslated, out of step
    python tests/translation.py start chapters/12_new.ipynb # a new chapter: chapters-ko/12_new.ipynb, untranslated
    python tests/translation.py sync                        # after English cells were added/removed/moved
    python tests/translation.py stamp chapters-ko/03_kv_cache.ipynb --cells 4 7   # "I re-translated these"

Each Korean notebook in ``chapters-ko/`` has the same cells as its English source in
``chapters/``, in the same order, with the same metadata (slide types, tags, hidden inputs,
``keep_output``). Its code cells equal the English ones up to string literals and comments
(compared with Python's :mod:`tokenize`; inside f-strings the ``{expressions}`` must match too).
Every Korean cell records the English text it was translated from as a short hash,
``metadata.translation.en``; when the English cell changes, the hashes differ and ``status``
lists the cell as stale, with its first line, so a maintainer knows what to re-translate, and
``stamp`` records the new English text once it is done. ``tests/test_translation.py`` fails on
anything ``status`` reports.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import hashlib
import io
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
EN_DIR = ROOT / "chapters"
KO_DIR = ROOT / "chapters-ko"
KEY = "translation"
HANGUL = re.compile(r"[\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f]")


def source_hash(source: str) -> str:
    """The short hash a Korean cell keeps of the English text it translates (12 hex digits of SHA-1)."""
    return hashlib.sha1(source.encode("utf-8")).hexdigest()[:12]


def _fstring_fields(token: str) -> list[str]:
    """The ``{expressions}`` of an f-string token (dumped ASTs), so a code change inside one counts."""
    try:
        node = ast.parse(token, mode="eval").body
    except SyntaxError:
        return [token]
    return [ast.dump(v.value) + f"!{v.conversion}" + (ast.dump(v.format_spec) if v.format_spec else "")
            for v in ast.walk(node) if isinstance(v, ast.FormattedValue)]


def code_skeleton(source: str) -> list[str]:
    """``source`` as tokens, with every string literal (and run of adjacent literals) one placeholder
    and comments and blank lines dropped: two code cells are "the same code" when these are equal.

    A line Python cannot tokenize (an IPython magic such as ``%timeit``) is compared as text.
    """
    out: list[str] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return [line.strip() for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    for tok in tokens:
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER):
            continue
        if tok.type == tokenize.NEWLINE:
            text = "\n"
        elif tok.type == tokenize.STRING:
            prefix = re.match(r"[A-Za-z]*", tok.string).group(0).lower()
            fields = _fstring_fields(tok.string) if "f" in prefix else []
            text = "<str>" + "|".join(fields)
            if out and out[-1].startswith("<str>"):          # "a" "b" and "ab" are the same code
                out[-1] += ("|" if fields and out[-1] != "<str>" else "") + "|".join(fields)
                continue
        elif tok.type in (tokenize.INDENT, tokenize.DEDENT):
            text = tok.type == tokenize.INDENT and "<indent>" or "<dedent>"
        else:
            text = tok.string
        out.append(text)
    while out and out[-1] in ("\n", "<dedent>"):
        out.pop()
    return out


def _prose_words(markdown: str) -> int:
    """English words (3+ letters) of a markdown cell outside code spans, math and links' targets."""
    text = re.sub(r"```.*?```|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|\]\([^)]*\)|<[^>]+>", " ", markdown, flags=re.S)
    return len(re.findall(r"\b[A-Za-z]{3,}\b", text))


def _meta(cell) -> dict:
    meta = copy.deepcopy(dict(cell.get("metadata", {})))
    meta.pop(KEY, None)
    return meta


@dataclass
class Report:
    """What is out of step between one English chapter and its Korean edition."""

    name: str
    missing: bool = False
    structure: list[str] = field(default_factory=list)      # cell counts, types, metadata
    code: list[int] = field(default_factory=list)           # code cells whose code differs
    untranslated: list[int] = field(default_factory=list)   # never stamped, or English prose left
    stale: list[int] = field(default_factory=list)          # English changed since the translation
    first_lines: dict[int, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.structure or self.code or self.untranslated or self.stale)

    def lines(self) -> list[str]:
        if self.ok:
            return [f"{self.name}: in step"]
        out = [f"{self.name}:"]
        if self.missing:
            out.append("  no Korean edition (python tests/translation.py start chapters/" + self.name + ")")
        out += [f"  structure: {s}" for s in self.structure]
        for label, cells in (("code differs from the English (beyond strings and comments)", self.code),
                             ("untranslated", self.untranslated), ("stale: the English changed", self.stale)):
            if cells:
                out.append(f"  {label}:")
                out += [f"    cell {i}: {self.first_lines.get(i, '')}" for i in cells]
        return out


def compare(en_path: Path, ko_path: Path) -> Report:
    """Compare an English chapter with its Korean edition (see the module's docstring)."""
    report = Report(en_path.name)
    if not ko_path.exists():
        report.missing = True
        return report
    en = nbformat.read(en_path, as_version=4)
    ko = nbformat.read(ko_path, as_version=4)
    if len(en.cells) != len(ko.cells):
        report.structure.append(f"{len(en.cells)} English cells, {len(ko.cells)} Korean "
                                "(python tests/translation.py sync)")
    if en.metadata.get("kernelspec") != ko.metadata.get("kernelspec"):
        report.structure.append("kernelspec differs")
    for i, (e, k) in enumerate(zip(en.cells, ko.cells)):
        report.first_lines[i] = (e.source.strip().splitlines() or [""])[0][:90]
        if e.cell_type != k.cell_type:
            report.structure.append(f"cell {i}: {e.cell_type} in English, {k.cell_type} in Korean")
            continue
        if _meta(e) != _meta(k):
            report.structure.append(f"cell {i}: metadata differs ({_meta(e)} vs {_meta(k)})")
        if e.cell_type == "code" and code_skeleton(e.source) != code_skeleton(k.source):
            report.code.append(i)
        stamp = k.get("metadata", {}).get(KEY, {}).get("en")
        if stamp is None:
            report.untranslated.append(i)
        elif stamp != source_hash(e.source):
            report.stale.append(i)
        elif e.cell_type == "markdown" and _prose_words(e.source) >= 4 and not HANGUL.search(k.source):
            report.untranslated.append(i)
    return report


def chapter_pairs() -> list[tuple[Path, Path]]:
    """Every English chapter with the path of its Korean edition (which may not exist yet)."""
    return [(p, KO_DIR / p.name) for p in sorted(EN_DIR.glob("[0-9][0-9]_*.ipynb"))]


def stamp(ko_path: Path, cells: list[int] | None = None) -> int:
    """Record, in the Korean cells ``cells`` (default: all), the English text they now translate.

    Returns the number of cells stamped. Raises ``ValueError`` for a cell index out of range or a
    notebook whose cell count differs from the English (``sync`` first).
    """
    en = nbformat.read(EN_DIR / ko_path.name, as_version=4)
    ko = nbformat.read(ko_path, as_version=4)
    if len(en.cells) != len(ko.cells):
        raise ValueError(f"{ko_path.name}: {len(en.cells)} English cells, {len(ko.cells)} Korean; run sync first")
    todo = range(len(ko.cells)) if cells is None else cells
    for i in todo:
        if not 0 <= i < len(ko.cells):
            raise ValueError(f"cells must be in [0, {len(ko.cells) - 1}], got {i}")
        ko.cells[i].metadata[KEY] = {"en": source_hash(en.cells[i].source)}
    nbformat.write(ko, ko_path)
    return len(todo)


def start(en_path: Path) -> Path:
    """A new Korean edition of ``en_path``: a copy whose cells are all listed as untranslated."""
    ko_path = KO_DIR / en_path.name
    if ko_path.exists():
        raise ValueError(f"{ko_path} exists; use sync")
    nb = nbformat.read(en_path, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop(KEY, None)
    KO_DIR.mkdir(exist_ok=True)
    nbformat.write(nb, ko_path)
    return ko_path


def sync(ko_path: Path) -> list[str]:
    """Bring a Korean edition's cells in step with its English source after cells were added,
    removed or moved: a Korean cell whose English text is unchanged keeps its place by the order
    of the English; a changed English cell keeps the Korean cell it had (listed as stale); a new
    English cell is copied untranslated. Metadata follow the English. Returns what it did."""
    en = nbformat.read(EN_DIR / ko_path.name, as_version=4)
    ko = nbformat.read(ko_path, as_version=4)
    en_keys = [source_hash(c.source) for c in en.cells]
    ko_keys = [c.metadata.get(KEY, {}).get("en", f"none-{i}") for i, c in enumerate(ko.cells)]
    cells, done = [], []
    for op, e0, e1, k0, k1 in difflib.SequenceMatcher(None, en_keys, ko_keys, autojunk=False).get_opcodes():
        if op == "equal" or (op == "replace" and e1 - e0 == k1 - k0):
            pairs = list(zip(range(e0, e1), range(k0, k1)))
            cells += [(i, ko.cells[j]) for i, j in pairs]
            if op == "replace":
                done += [f"cell {i}: English changed, Korean kept (stale)" for i, _ in pairs]
        else:
            cells += [(i, copy.deepcopy(en.cells[i])) for i in range(e0, e1)]
            done += [f"cell {i}: new in English, copied untranslated" for i in range(e0, e1)]
            done += [f"Korean cell {j}: no English cell any more, removed" for j in range(k0, k1)]
    aligned = []
    for i, cell in cells:
        if cell.cell_type != en.cells[i].cell_type:
            cell = copy.deepcopy(en.cells[i])
            done.append(f"cell {i}: cell type changed, copied untranslated")
        keep = cell.metadata.get(KEY)
        cell.metadata = copy.deepcopy(en.cells[i].metadata)
        cell.metadata.pop(KEY, None)
        if keep:
            cell.metadata[KEY] = keep
        if "id" in en.cells[i]:
            cell["id"] = en.cells[i]["id"]
        aligned.append(cell)
    ko.cells = aligned
    nbformat.write(ko, ko_path)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="list what is out of step, chapter by chapter")
    p = sub.add_parser("start", help="begin the Korean edition of a new English chapter")
    p.add_argument("chapter", type=Path)
    p = sub.add_parser("sync", help="realign Korean cells after English cells were added, removed or moved")
    p.add_argument("notebooks", nargs="*", type=Path)
    p = sub.add_parser("stamp", help="mark Korean cells as translated from the English text they have now")
    p.add_argument("notebook", type=Path)
    p.add_argument("--cells", type=int, nargs="+", help="cell indices (default: every cell)")
    args = parser.parse_args(argv)
    if args.command == "status":
        reports = [compare(en, ko) for en, ko in chapter_pairs()]
        extra = sorted({p.name for p in KO_DIR.glob("*.ipynb")} - {r.name for r in reports})
        for r in reports:
            print("\n".join(r.lines()))
        for name in extra:
            print(f"{name}: in chapters-ko/ but not in chapters/")
        return 0 if all(r.ok for r in reports) and not extra else 1
    if args.command == "start":
        print(start(args.chapter))
        return 0
    if args.command == "sync":
        for path in args.notebooks or [ko for _, ko in chapter_pairs() if ko.exists()]:
            for line in sync(path) or ["in step"]:
                print(f"{path.name}: {line}")
        return 0
    print(f"{args.notebook.name}: {stamp(args.notebook, args.cells)} cells stamped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
