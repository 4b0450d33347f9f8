"""The Korean edition stays in step with the English one, and the package's words are all translated.

* every chapter in ``chapters/`` has a Korean edition in ``chapters-ko/`` with the same cells, the
  same metadata, the same code up to strings and comments, and every cell translated from the
  English text it has now (``tests/translation.py status`` reports the same);
* every message the package shows through ``labsupport.i18n.tr`` has a Korean translation with the
  same ``{fields}``, and the catalogue holds nothing the code no longer shows;
* the glossary's terms are used: a term of an English chapter appears in its Korean edition, with
  the English in parentheses at its first use;
* Korean text appears in the package only in its catalogue.
"""

from __future__ import annotations

import ast
import re
import string
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import translation as tl

from labsupport import i18n

PACKAGE = ROOT / "labsupport"
CATALOGUE_DIR = PACKAGE / "i18n" / "ko"
GLOSSARY = ROOT / "chapters-ko" / "glossary.md"


# ------------------------------------------------------------------------ the tool itself
def test_code_skeleton_ignores_strings_and_comments_but_not_code():
    en = 'x = f"{n:.2f} tokens per step"  # per step\nprint("a" "b", end="")\n'
    assert tl.code_skeleton(en) == tl.code_skeleton('x = f"스텝당 토큰 {n:.2f}개"\n\nprint("ab", end="")\n')
    assert tl.code_skeleton(en) != tl.code_skeleton('x = f"{n:.3f} tokens per step"\nprint("a", end="")\n')
    assert tl.code_skeleton(en) != tl.code_skeleton('x = f"{m:.2f} tokens"\nprint("a", end="")\n')
    assert tl.code_skeleton(en) != tl.code_skeleton('x = f"{n:.2f} tokens"\nprint("a", end="", flush=True)\n')
    assert tl.code_skeleton("print(f\"{'faster' if x else 'slower'}\")") == \
        tl.code_skeleton("print(f\"{'빠름' if x else '느림'}\")")                     # strings inside an expression
    assert tl.code_skeleton("print(f\"{'a' if x else 'b'}\")") != tl.code_skeleton("print(f\"{'a' if y else 'b'}\")")
    assert tl.code_skeleton("%timeit f(1)") == tl.code_skeleton("%timeit f(1)  # 시간")


def _pair(tmp_path, en_sources, ko_sources, monkeypatch):
    monkeypatch.setattr(tl, "EN_DIR", tmp_path / "en")
    monkeypatch.setattr(tl, "KO_DIR", tmp_path / "ko")
    monkeypatch.setattr(tl, "BACKUP_DIR", tmp_path / "backup")
    for folder, sources in (("en", en_sources), ("ko", ko_sources)):
        (tmp_path / folder).mkdir()
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_markdown_cell(s) if s.startswith("#") else nbformat.v4.new_code_cell(s)
                    for s in sources]
        nbformat.write(nb, tmp_path / folder / "01_x.ipynb")
    return tmp_path / "en" / "01_x.ipynb", tmp_path / "ko" / "01_x.ipynb"


def test_compare_reports_untranslated_stale_and_changed_code(tmp_path, monkeypatch):
    en, ko = _pair(tmp_path, ["# Sampling picks the next token", "x = 1"],
                   ["# 샘플링(sampling)은 다음 토큰을 고릅니다", "x = 1"], monkeypatch)
    assert tl.compare(en, ko).untranslated == [0, 1]            # never stamped
    tl.stamp(ko)
    assert tl.compare(en, ko).ok
    nb = nbformat.read(en, 4)
    nb.cells[0].source += " of the text"
    nb.cells[1].source = "x = 2"
    nbformat.write(nb, en)
    report = tl.compare(en, ko)
    assert report.stale == [0, 1] and report.code == [1]
    nb.cells.insert(1, nbformat.v4.new_markdown_cell("# A new cell about the KV cache"))
    nbformat.write(nb, en)
    assert tl.compare(en, ko).structure


def test_sync_keeps_translations_and_copies_new_cells(tmp_path, monkeypatch):
    en, ko = _pair(tmp_path, ["# One sentence here", "x = 1", "# Another sentence here"],
                   ["# 한 문장", "x = 1", "# 다른 문장"], monkeypatch)
    tl.stamp(ko)
    nb = nbformat.read(en, 4)
    nb.cells.insert(2, nbformat.v4.new_code_cell("y = 2"))
    nbformat.write(nb, en)
    done = tl.sync(ko)
    assert any("new in English" in d for d in done)
    report = tl.compare(en, ko)
    assert not report.structure and report.untranslated == [2]
    assert [c.source for c in nbformat.read(ko, 4).cells] == ["# 한 문장", "x = 1", "y = 2", "# 다른 문장"]


def _sources(path):
    return [c.source for c in nbformat.read(path, 4).cells]


def _edit_english(en, change):
    nb = nbformat.read(en, 4)
    change(nb.cells)
    nbformat.write(nb, en)


THREE = (["# One sentence here", "x = 1", "# Another sentence here"], ["# 한 문장", "x = 1", "# 다른 문장"])


def test_sync_keeps_a_moved_cell(tmp_path, monkeypatch):
    en, ko = _pair(tmp_path, *THREE, monkeypatch)
    tl.stamp(ko)
    _edit_english(en, lambda cells: cells.append(cells.pop(0)))
    tl.sync(ko)
    assert _sources(ko) == ["x = 1", "# 다른 문장", "# 한 문장"] and tl.compare(en, ko).ok


def test_sync_keeps_a_changed_cell_next_to_a_new_one(tmp_path, monkeypatch):
    en, ko = _pair(tmp_path, *THREE, monkeypatch)
    tl.stamp(ko)

    def change(cells):
        cells[0].source = "# One sentence here, longer"
        cells.insert(1, nbformat.v4.new_markdown_cell("# A new paragraph here"))
    _edit_english(en, change)
    done = tl.sync(ko)
    assert _sources(ko) == ["# 한 문장", "# A new paragraph here", "x = 1", "# 다른 문장"]
    report = tl.compare(en, ko)
    assert report.stale == [0] and report.untranslated == [1] and any("stale" in d for d in done)


def test_sync_of_an_unstamped_translation_loses_nothing(tmp_path, monkeypatch):
    en, ko = _pair(tmp_path, *THREE, monkeypatch)                 # translated, never stamped
    assert tl.sync(ko) == []                                      # nothing changed, nothing claimed
    _edit_english(en, lambda cells: cells.append(nbformat.v4.new_code_cell("y = 2")))
    tl.sync(ko)
    assert _sources(ko) == ["# 한 문장", "x = 1", "# 다른 문장", "y = 2"]


def test_sync_saves_a_removed_translation(tmp_path, monkeypatch):
    en, ko = _pair(tmp_path, *THREE, monkeypatch)
    tl.stamp(ko)
    _edit_english(en, lambda cells: cells.pop(2))
    done = tl.sync(ko)
    assert _sources(ko) == ["# 한 문장", "x = 1"]
    backups = list((tmp_path / "backup").glob("*.ipynb"))
    assert len(backups) == 1 and "# 다른 문장" in _sources(backups[0]) and any("removed" in d for d in done)


def test_a_bad_stamp_is_reported_with_its_cell(tmp_path, monkeypatch):
    en, ko = _pair(tmp_path, *THREE, monkeypatch)
    tl.stamp(ko)
    nb = nbformat.read(ko, 4)
    nb.cells[1].metadata["translation"] = "abc"
    nbformat.write(nb, ko)
    report = tl.compare(en, ko)
    assert any(s.startswith("cell 1: metadata.translation must be") for s in report.structure)
    tl.sync(ko)                                                   # readable again; the cell is then unstamped
    assert tl.compare(en, ko).untranslated == [1]


def test_stamp_and_start_refuse_what_is_not_theirs(tmp_path, monkeypatch):
    en, ko = _pair(tmp_path, ["# a b c d"], ["# 가"], monkeypatch)
    with pytest.raises(ValueError, match=r"cells must be in \[0, 0\], got 3"):
        tl.stamp(ko, [3])
    with pytest.raises(ValueError, match="must not repeat"):
        tl.stamp(ko, [0, 0])
    with pytest.raises(TypeError, match="cells must be cell indices"):
        tl.stamp(ko, [True])
    with pytest.raises(ValueError, match="the notebook to stamp must be a chapter NN_\\*.ipynb in"):
        tl.stamp(en)                                              # the English edition is never stamped
    assert "translation" not in nbformat.read(en, 4).cells[0].metadata
    with pytest.raises(ValueError, match="the chapter to start must be a chapter"):
        tl.start(tmp_path / "elsewhere" / "12_new.ipynb")
    with pytest.raises(ValueError, match="exists; use sync"):
        tl.start(en)


# ------------------------------------------------------------------------ the chapters
PAIRS = tl.chapter_pairs()


def test_every_korean_notebook_has_an_english_source():
    english = {en.name for en, _ in PAIRS}
    assert english, "no chapters found"
    assert {p.name for p in tl.KO_DIR.glob("*.ipynb")} <= english


@pytest.mark.parametrize("en,ko", PAIRS, ids=lambda p: p.stem if isinstance(p, Path) else p)
def test_korean_chapter_is_in_step_with_the_english(en, ko):
    report = tl.compare(en, ko)
    assert report.ok, "\n".join(report.lines()) + "\n(python tests/translation.py status)"


@pytest.mark.parametrize("en,ko", PAIRS, ids=lambda p: p.stem if isinstance(p, Path) else p)
def test_korean_chapter_sets_the_language(en, ko):
    text = "\n".join(c.source for c in nbformat.read(ko, 4).cells if c.cell_type == "code")
    assert re.search(r"""(setup_chapter\([^)]*lang=|set_language\()["']ko["']""", text), \
        f"{ko.name}: its set-up cell must choose Korean (setup_chapter(..., lang=\"ko\"))"


AVOIDED_HEADING = "## 피하는 말"


def _glossary() -> list[tuple[str, str]]:
    rows = []
    for line in GLOSSARY.read_text(encoding="utf-8").split(AVOIDED_HEADING)[0].splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cols) >= 2 and cols[0] not in ("English", "") and not cols[0].startswith("-"):
            rows.append((cols[0], cols[1]))
    return rows


def _prose(nb) -> str:
    """The markdown of a notebook without code spans, code blocks and math."""
    text = "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return re.sub(r"```.*?```|`[^`]*`|\$\$.*?\$\$|\$[^$\n]*\$", " ", text, flags=re.DOTALL)


def test_glossary_is_well_formed():
    rows = _glossary()
    assert len(rows) >= 40
    assert len({en.lower() for en, _ in rows}) == len(rows), "an English term twice"
    assert len({ko for _, ko in rows}) == len(rows), "a Korean term twice"
    assert all(tl.HANGUL.search(ko) for _, ko in rows)


def _avoided() -> list[tuple[str, str]]:
    """The glossary's "피하는 말" table: (a fragment the Korean edition does not use, the word it uses instead)."""
    text = GLOSSARY.read_text(encoding="utf-8")
    assert AVOIDED_HEADING in text, f"{GLOSSARY.name} has no {AVOIDED_HEADING!r} section"
    rows = []
    for line in text.split(AVOIDED_HEADING)[1].splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cols) >= 2 and cols[0] != "피하는 말" and not cols[0].startswith("-"):
            rows += [(fragment.strip(), cols[1]) for fragment in cols[0].split(",")]
    return rows


def test_korean_edition_avoids_the_renderings_the_glossary_retires():
    """One concept, one name (korean-reader review): no retired rendering in a Korean chapter (sources and kept
    outputs), the Korean README or the package's Korean catalogue."""
    rows = _avoided()
    assert len(rows) >= 8 and all(fragment for fragment, _ in rows)
    texts = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
             for p in [*sorted((ROOT / "chapters-ko").glob("*.ipynb")), ROOT / "README.ko.md",
                       *sorted((ROOT / "labsupport" / "i18n" / "ko").glob("*.py"))]}
    assert len(texts) > 13
    found = [f"{name}: {fragment!r} (write {instead!r}): …{text[max(0, at - 30):at + 30]!r}…"
             for name, text in texts.items() for fragment, instead in rows
             for at in [text.find(fragment)] if at >= 0]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("en,ko", [p for p in PAIRS if p[1].exists()], ids=lambda p: p.stem if isinstance(p, Path) else p)
def test_glossary_terms_are_used_with_the_english_at_first_use(en, ko):
    english, korean = _prose(nbformat.read(en, 4)), _prose(nbformat.read(ko, 4))
    rows = _glossary()
    problems = []
    for term, ko_term in rows:
        if not re.search(rf"\b{re.escape(term)}(s|es)?\b", english, flags=re.IGNORECASE):
            continue
        masked = korean                              # a longer term containing this one is not a use of it
        for _, longer in rows:
            if ko_term in longer and longer != ko_term:
                masked = masked.replace(longer, "\0" * len(longer))
        at = masked.find(ko_term)
        if at < 0:
            problems.append(f"{term!r} is in the English chapter; {ko_term!r} is not in the Korean one")
            continue
        after = korean[at + len(ko_term):at + len(ko_term) + len(term) + 6].lstrip(" \n*_")   # **term**(English) too
        if not after.lower().startswith("(" + term.lower()):
            problems.append(f"first {ko_term!r} is not followed by ({term}): "
                            f"…{korean[max(0, at - 20):at + len(ko_term) + 25]!r}…")
    assert not problems, f"{ko.name} (terms of chapters-ko/glossary.md):\n" + "\n".join(problems)


# ------------------------------------------------------------------------ the package's words
def _tr_calls() -> dict[str, list[str]]:
    """Every literal message passed to ``tr(...)`` or marked with ``N_(...)`` in the package → where it is."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if CATALOGUE_DIR in path.parents or path == PACKAGE / "i18n" / "__init__.py":   # the mechanism itself
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = getattr(node.func, "id", getattr(node.func, "attr", None)) if isinstance(node, ast.Call) else None
            if name in ("tr", "N_"):            # tr_marked(x) translates what an N_("...") marked
                assert node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str), \
                    f"{path.relative_to(ROOT)}:{node.lineno}: {name}() takes the English text as a literal"
                found.setdefault(node.args[0].value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def _fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def test_the_package_translates_its_words():
    assert len(_tr_calls()) >= 20


def test_every_message_has_a_korean_translation_with_the_same_fields():
    ko = i18n.catalogue("ko")
    calls = _tr_calls()
    missing = [f"{where[0]}: {msg!r}" for msg, where in calls.items() if msg not in ko]
    assert not missing, f"{len(missing)} messages without a Korean translation (labsupport/i18n/ko/):\n" + \
        "\n".join(missing)
    differ = [f"{msg!r}: {sorted(_fields(msg))} vs {sorted(_fields(ko[msg]))}"
              for msg in calls if _fields(msg) != _fields(ko[msg])]
    assert not differ, "fields differ:\n" + "\n".join(differ)
    assert all(tl.HANGUL.search(text) or not re.search("[A-Za-z]{4,}", msg) or msg.strip() == text.strip()
               for msg, text in ko.items() if msg in calls)


def test_the_catalogue_holds_only_messages_the_code_shows():
    unused = sorted(set(i18n.catalogue("ko")) - set(_tr_calls()))
    assert not unused, "translations of messages no code shows (remove them):\n" + "\n".join(map(repr, unused))


def test_korean_appears_in_the_package_only_in_its_catalogue():
    offenders = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*")
                 if p.is_file() and p.suffix in (".py", ".md", ".txt", ".json", ".html", ".css", ".js")
                 and CATALOGUE_DIR not in p.parents and tl.HANGUL.search(p.read_text(encoding="utf-8", errors="ignore"))]
    assert not offenders
    english = [str(p.relative_to(ROOT)) for p in (ROOT / "chapters").glob("*.ipynb")
               if tl.HANGUL.search(p.read_text(encoding="utf-8"))]
    assert not english, "Korean text in an English chapter"
    shared = [name for name in ("README.md", "Makefile", "pyproject.toml", "environment.yml", ".ci/run")
              if (ROOT / name).exists() and tl.HANGUL.search((ROOT / name).read_text(encoding="utf-8"))]
    assert not shared, f"Korean text outside the Korean edition's files: {shared}"


def test_language_switch_and_fallback(monkeypatch):
    before = i18n.get_language()
    try:
        i18n.set_language("ko")
        assert i18n.tr("a message no catalogue has {n}", n=3) == "a message no catalogue has 3"   # English fallback
        ko = i18n.catalogue("ko")
        msg = next(m for m in ko if not _fields(m))
        assert i18n.tr(msg) == ko[msg] != msg
        i18n.set_language("en")
        assert i18n.tr(msg) == msg
        with pytest.raises(ValueError, match=r"message '\{n\} of \{m\}' needs the field 'm'; given \['n'\]"):
            i18n.tr("{n} of {m}", n=1)
        with pytest.raises(TypeError):
            i18n.catalogue("ko")[msg] = "x"                     # read-only: no panel's words change behind its back
        with pytest.raises(ValueError, match=r"lang must be one of \('en', 'ko'\), got 'fr'"):
            i18n.set_language("fr")
        with pytest.raises(TypeError, match="lang must be a str"):
            i18n.set_language(None)
        monkeypatch.setattr(i18n, "_language", None)
        monkeypatch.setenv("LABSUPPORT_LANG", "ko")
        assert i18n.get_language() == "ko"
        monkeypatch.setenv("LABSUPPORT_LANG", "de")
        with pytest.raises(ValueError, match=r"\$LABSUPPORT_LANG must be one of"):
            i18n.get_language()
    finally:
        i18n._language = before


def test_language_block_restores_and_setup_chapter_validates_lang():
    before = i18n.get_language()
    with i18n.language("ko"):
        assert i18n.get_language() == "ko"
    assert i18n.get_language() == before
    from labsupport.lab import setup_chapter
    with pytest.raises(ValueError, match=r"lang must be one of \('en', 'ko'\), got 'kr'"):
        setup_chapter(lang="kr", verbose=False)
    assert i18n.get_language() == before
