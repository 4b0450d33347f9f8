"""Slide metadata the live deck (jupyterlab-slideshow) shows: panels and the set-up cell are on slides."""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

from labsupport.slides import CONTINUE, HIDDEN_SLIDE_TYPES, SLIDE_TYPES, deck_slide_types

ROOT = Path(__file__).resolve().parent.parent
WIDGETS = ROOT / "labsupport" / "widgets"


def _panel_builders() -> set[str]:
    """Public functions of ``labsupport/widgets`` that return a panel (annotated ``...VBox`` / ``Panel``)."""
    names = set()
    for path in WIDGETS.glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if (isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and node.returns is not None
                    and ast.unparse(node.returns).split(".")[-1] in ("VBox", "Panel")):
                names.add(node.name)
    return names


def _shows_panel(source: str, builders: set[str]) -> bool:
    """True when the cell's last statement is a call of a panel builder (its result is the cell's output)."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    last = body[-1] if body else None
    return (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
            and isinstance(last.value.func, ast.Name) and last.value.func.id in builders)


def _chapters() -> list[Path]:
    chapters = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    assert chapters, "no chapters found"
    return chapters


def test_the_panel_builders_are_found():
    builders = _panel_builders()
    assert {"temperature_panel", "sampling_lab", "beam_explorer", "quiz_panel"} <= builders
    assert "panel_int" not in builders and "error_html" not in builders


def test_rule_maps_classic_continue_and_shows_the_setup_cell():
    nb = nbformat.v4.new_notebook()
    title = nbformat.v4.new_markdown_cell("# Title")
    title.metadata["slideshow"] = {"slide_type": "slide"}
    setup = nbformat.v4.new_code_cell("lm = setup_chapter()")
    setup.metadata["slideshow"] = {"slide_type": "skip"}
    panel = nbformat.v4.new_code_cell("temperature_panel(lm, 'a')")
    panel.metadata["slideshow"] = {"slide_type": "-"}
    bare = nbformat.v4.new_markdown_cell("no slide metadata")
    solution = nbformat.v4.new_code_cell("# solution")
    solution.metadata["slideshow"] = {"slide_type": "skip"}
    nb.cells = [title, setup, panel, bare, solution]
    deck_slide_types(nb)
    kinds = [c.metadata["slideshow"]["slide_type"] for c in nb.cells]
    assert kinds == ["slide", CONTINUE, CONTINUE, CONTINUE, "skip"]   # only the first code cell is un-skipped
    before = nbformat.writes(nb)
    assert nbformat.writes(deck_slide_types(nb)) == before           # idempotent


def test_rule_rejects_an_unknown_slide_type():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_markdown_cell("x")
    cell.metadata["slideshow"] = {"slide_type": "Slide"}
    nb.cells = [cell]
    with pytest.raises(ValueError, match="slide_type must be one of"):
        deck_slide_types(nb)


@pytest.mark.parametrize("path", _chapters(), ids=lambda p: p.stem)
def test_chapter_slide_types_put_every_panel_and_the_setup_on_a_slide(path):
    """jupyterlab-slideshow shows a cell only for "", slide, subslide, fragment (never "-", skip, notes)."""
    nb = nbformat.read(path, as_version=4)
    builders = _panel_builders()
    kinds = [c.metadata.get("slideshow", {}).get("slide_type") for c in nb.cells]
    assert set(kinds) <= set(SLIDE_TYPES), f"{path.name}: slide types {set(kinds) - set(SLIDE_TYPES)}"
    code = [(c, k) for c, k in zip(nb.cells, kinds, strict=True) if c.cell_type == "code"]
    assert code and code[0][1] not in HIDDEN_SLIDE_TYPES, f"{path.name}: the set-up cell is not on a slide"
    panels = [(c, k) for c, k in code if _shows_panel(c.source, builders)]
    assert panels, f"{path.name}: no panel cell found"
    hidden = [c.source[:60] for c, k in panels if k in HIDDEN_SLIDE_TYPES]
    assert not hidden, f"{path.name}: panels not on any slide: {hidden}"
    fixed = deck_slide_types(nbformat.read(path, as_version=4))        # the committed form is the rule's fixed point
    assert [c.metadata["slideshow"]["slide_type"] for c in fixed.cells] == kinds


@pytest.mark.parametrize("path", _chapters(), ids=lambda p: p.stem)
def test_every_cell_is_reachable_by_the_right_arrow_and_notes_are_there(path):
    """→ skips reveal.js's vertical subslides in the live deck: no chapter has one. The set-up's imports
    are hidden on the title slide (offline: tag hide-input; live: collapsed), and the key slides
    carry speaker notes (notes cells, collapsed in the notebook)."""
    from labsupport.slides import HIDE_INPUT

    nb = nbformat.read(path, as_version=4)
    kinds = [c.metadata.get("slideshow", {}).get("slide_type") for c in nb.cells]
    assert "subslide" not in kinds
    setup = next(c for c in nb.cells if c.cell_type == "code")
    assert HIDE_INPUT in setup.metadata.get("tags", []) and setup.metadata["jupyter"]["source_hidden"] is True
    notes = [c for c, k in zip(nb.cells, kinds) if k == "notes" and "speaker-notes" in c.metadata.get("tags", [])]
    assert len(notes) >= 3, f"{path.name}: {len(notes)} speaker-notes cells"
    assert all(c.metadata.get("jupyter", {}).get("source_hidden") and ("ask" in c.source.lower() or "the room" in c.source) for c in notes)
    # JupyterLab shows a rendered markdown cell whatever source_hidden says: the notes sit in a closed
    # <details> block, which the offline deck's speaker view opens
    from labsupport.slides import speaker_view

    for c in notes:
        body = c.source.strip()
        assert body.startswith("<details><summary>") and body.endswith("</details>"), body[:60]
        assert "<details open>" in speaker_view(c.source) and speaker_view(c.source).count("<details") == 1


def test_deck_rule_makes_subslides_slides_and_hides_the_setup_input():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("import x"),
                nbformat.v4.new_markdown_cell("b"), nbformat.v4.new_markdown_cell("n")]
    nb.cells[2].metadata["slideshow"] = {"slide_type": "subslide"}
    nb.cells[3].metadata["slideshow"] = {"slide_type": "notes"}
    nb.cells[3].metadata["tags"] = ["speaker-notes"]
    deck_slide_types(nb)
    assert nb.cells[2].metadata["slideshow"]["slide_type"] == "slide"
    assert nb.cells[1].metadata["tags"] == ["hide-input"] and nb.cells[1].metadata["jupyter"]["source_hidden"]
    assert nb.cells[3].metadata["jupyter"]["source_hidden"]
    deck_slide_types(nb)                                             # idempotent
    assert nb.cells[1].metadata["tags"] == ["hide-input"]


def test_quiz_snapshot_shows_the_options_and_an_answer_box():
    """The offline deck shows a quiz by its snapshot: every option of a question (not a bold 'None'
    for the unanswered choice) and an empty box for a numeric answer."""
    from labsupport.quiz import MultipleChoice, Numeric, Quiz
    from labsupport.widgets.quiz import quiz_panel

    quiz = Quiz([MultipleChoice("Pick one", ["alpha", "beta"], answer=0, explanation="x"),
                 Numeric("How many?", answer=3, unit="tokens", explanation="y")], title="t")
    bundle = quiz_panel(quiz)._repr_mimebundle_()
    shown = (bundle[0] if isinstance(bundle, tuple) else bundle)["text/html"]
    assert "○ alpha" in shown and "○ beta" in shown and "<b>None</b>" not in shown
    assert "a number in tokens" in shown
