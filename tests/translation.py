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
import itertools
import re
import sys
import time
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
    fields = [v for v in ast.walk(node) if isinstance(v, ast.FormattedValue)]
    for v in fields:                       # a string inside an expression ({'faster' if …}) may be translated
        for sub in ast.walk(v.value):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                sub.value = "<str>"
    return [_dump_fstring_field(v) for v in fields]


def _dump_fstring_field(v: ast.FormattedValue) -> str:
    value = ast.dump(v.value) if not isinstance(v.value, ast.JoinedStr) else "<fstr>"
    spec = ast.dump(v.format_spec) if v.format_spec else ""
    return f"{value}!{v.conversion}{spec}"


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
    text = re.sub(r"```.*?```|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|\]\([^)]*\)|<[^>]+>", " ", markdown, flags=re.DOTALL)
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


def stamp_of(cell, where: str = "") -> str | None:
    """The English hash a Korean cell records (``metadata.translation.en``), or None when it has none.

    Raises:
        ValueError: the record is there but not ``{"en": "<12 hex digits>"}`` (``where`` names the cell).
    """
    record = cell.get("metadata", {}).get(KEY)
    if record is None:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("en"), str) or \
            not re.fullmatch(r"[0-9a-f]{12}", record["en"]):
        raise ValueError(f"{where}metadata.{KEY} must be {{'en': '<12 hex digits>'}}, got {record!r}")
    return record["en"]


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
        try:
            stamp = stamp_of(k, f"cell {i}: ")
        except ValueError as err:
            report.structure.append(str(err))
            continue
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


def _chapter_in(path: Path, folder: Path, what: str) -> Path:
    """``path`` when it is a chapter (``NN_*.ipynb``) directly in ``folder``; else a ValueError."""
    path = Path(path)
    if path.resolve().parent != folder.resolve() or not re.fullmatch(r"\d\d_.+\.ipynb", path.name):
        raise ValueError(f"{what} must be a chapter NN_*.ipynb in {folder}, got {path}")
    return path


def stamp(ko_path: Path, cells: list[int] | None = None) -> int:
    """Record, in the Korean cells ``cells`` (default: all), the English text they now translate.

    Returns the number of cells stamped.

    Raises:
        TypeError: a cell index is not an int.
        ValueError: ``ko_path`` is not a chapter of ``chapters-ko/``; a cell index out of range or
            given twice; a notebook whose cell count differs from the English (``sync`` first).
    """
    ko_path = _chapter_in(ko_path, KO_DIR, "the notebook to stamp")
    en = nbformat.read(EN_DIR / ko_path.name, as_version=4)
    ko = nbformat.read(ko_path, as_version=4)
    if len(en.cells) != len(ko.cells):
        raise ValueError(f"{ko_path.name}: {len(en.cells)} English cells, {len(ko.cells)} Korean; run sync first")
    todo = list(range(len(ko.cells))) if cells is None else list(cells)
    for i in todo:
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"cells must be cell indices (int), got {i!r}")
        if not 0 <= i < len(ko.cells):
            raise ValueError(f"cells must be in [0, {len(ko.cells) - 1}], got {i}")
    if len(set(todo)) != len(todo):
        raise ValueError(f"cells must not repeat an index, got {todo}")
    for i in todo:
        ko.cells[i].metadata[KEY] = {"en": source_hash(en.cells[i].source)}
    nbformat.write(ko, ko_path)
    return len(todo)


def start(en_path: Path) -> Path:
    """A new Korean edition of the chapter ``en_path``: a copy whose cells are all listed as untranslated.

    Raises:
        ValueError: ``en_path`` is not a chapter of ``chapters/``, or its Korean edition exists.
    """
    en_path = _chapter_in(en_path, EN_DIR, "the chapter to start")
    ko_path = KO_DIR / en_path.name
    if ko_path.exists():
        raise ValueError(f"{ko_path} exists; use sync")
    nb = nbformat.read(en_path, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop(KEY, None)
    KO_DIR.mkdir(exist_ok=True)
    nbformat.write(nb, ko_path)
    return ko_path


def _pairs(en_cells, ko_cells) -> dict[int, int]:
    """English cell index → the Korean cell that translates it, for the cells that can be paired.

    1. Korean cells whose stamp equals the English cell's hash, in order (``difflib``): unchanged cells;
    2. a stamp that matches an English cell elsewhere: a moved cell;
    3. between two unchanged anchors, the remaining cells of the same type, in order: changed cells
       (or cells never stamped).
    """
    en_keys = [source_hash(c.source) for c in en_cells]
    ko_keys = []
    for j, c in enumerate(ko_cells):
        try:
            ko_keys.append(stamp_of(c) or f"unstamped-{j}")
        except ValueError:
            ko_keys.append(f"unreadable-{j}")
    pairs: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(None, en_keys, ko_keys, autojunk=False)
    for block in matcher.get_matching_blocks():
        pairs.update({block.a + d: block.b + d for d in range(block.size)})
    anchors = sorted(pairs.items())
    free_ko = {j for j in range(len(ko_cells))} - set(pairs.values())
    for i, key in enumerate(en_keys):                      # moved: its stamp is elsewhere
        if i not in pairs:
            j = next((j for j in sorted(free_ko) if ko_keys[j] == key), None)
            if j is not None:
                pairs[i] = j
                free_ko.discard(j)
    bounds = [(-1, -1), *anchors, (len(en_cells), len(ko_cells))]
    for (a0, b0), (a1, b1) in itertools.pairwise(bounds):      # the gaps between unchanged cells
        en_gap = [i for i in range(a0 + 1, a1) if i not in pairs]
        ko_gap = [j for j in range(b0 + 1, b1) if j in free_ko]
        types = difflib.SequenceMatcher(None, [en_cells[i].cell_type for i in en_gap],
                                        [ko_cells[j].cell_type for j in ko_gap], autojunk=False)
        for block in types.get_matching_blocks():
            for d in range(block.size):
                pairs[en_gap[block.a + d]] = ko_gap[block.b + d]
                free_ko.discard(ko_gap[block.b + d])
    return pairs


BACKUP_DIR = ROOT / "build" / "translation-backup"


def sync(ko_path: Path) -> list[str]:
    """Bring a Korean edition's cells in step with its English source after cells were added,
    removed, moved or changed (see :func:`_pairs` for how cells are paired). A paired Korean cell
    keeps its text (``status`` lists it as stale when the English changed); an English cell with
    no Korean partner is copied untranslated; a Korean cell with no English partner is removed,
    and the notebook as it was is saved first in ``build/translation-backup/``, so no translation
    is ever lost. Metadata follow the English. Returns what it did, one line per change.

    Raises:
        ValueError: ``ko_path`` is not a chapter of ``chapters-ko/``.
    """
    ko_path = _chapter_in(ko_path, KO_DIR, "the notebook to sync")
    en = nbformat.read(EN_DIR / ko_path.name, as_version=4)
    ko = nbformat.read(ko_path, as_version=4)
    before = nbformat.writes(ko)
    pairs = _pairs(en.cells, ko.cells)
    done: list[str] = []
    aligned = []
    for i, e in enumerate(en.cells):
        j = pairs.get(i)
        if j is None:
            cell = copy.deepcopy(e)
            cell.metadata.pop(KEY, None)
            done.append(f"cell {i}: new in English, copied untranslated")
        else:
            cell = ko.cells[j]
            if j != i:
                done.append(f"cell {i}: the Korean cell {j} moved here")
            try:
                old = stamp_of(cell)
            except ValueError:
                old = None
                cell.metadata.pop(KEY, None)
                done.append(f"cell {i}: unreadable metadata.{KEY} removed (stamp it after checking)")
            if old is not None and old != source_hash(e.source):
                done.append(f"cell {i}: English changed, Korean kept (stale: re-translate, then stamp)")
            keep = cell.metadata.get(KEY)
            cell.metadata = copy.deepcopy(e.metadata)
            cell.metadata.pop(KEY, None)
            if keep:
                cell.metadata[KEY] = keep
        if "id" in e:
            cell["id"] = e["id"]
        aligned.append(cell)
    dropped = sorted(set(range(len(ko.cells))) - set(pairs.values()))
    for j in dropped:
        first = (ko.cells[j].source.strip().splitlines() or [""])[0][:60]
        done.append(f"Korean cell {j} has no English cell any more, removed: {first!r}")
    ko.cells = aligned
    after = nbformat.writes(ko)
    if after != before:
        if dropped:
            BACKUP_DIR.mkdir(parents=True, exist_ok=True)
            backup = BACKUP_DIR / f"{ko_path.stem}.{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
            backup.write_text(before, encoding="utf-8")
            done.append(f"the notebook as it was: {backup}")
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
    try:
        return _run(args)
    except (TypeError, ValueError) as err:
        parser.error(str(err))


def _run(args) -> int:
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
