"""Offline slide export: every script and style sheet is a local file; figures and panel snapshots survive."""

from __future__ import annotations

import json
import re

import nbformat
import plotly.graph_objects as go
import pytest

pytest.importorskip("sphinx_revealjs")
pytest.importorskip("jupyter_server_mathjax")

from labsupport.slides import export, install_vendor


def _deck_source(tmp_path):
    nb = nbformat.v4.new_notebook()
    title = nbformat.v4.new_markdown_cell("# Softmax\n$$p_i = e^{z_i/T} / \\sum_j e^{z_j/T}$$")
    title.metadata["slideshow"] = {"slide_type": "slide"}
    fig = nbformat.v4.new_code_cell("fig")
    fig.metadata["slideshow"] = {"slide_type": "slide"}
    fig.outputs = [nbformat.v4.new_output("display_data", data={
        "application/vnd.plotly.v1+json": go.Figure(go.Bar(y=[1, 2])).to_plotly_json(), "text/plain": "Figure"})]
    panel = nbformat.v4.new_code_cell("panel")
    panel.metadata["slideshow"] = {"slide_type": "subslide"}
    panel.outputs = [nbformat.v4.new_output("execute_result", execution_count=1, data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2, "version_minor": 0},
        "text/html": "<div class='labsupport-panel-snapshot'>T = <b>1.00</b></div>", "text/plain": "VBox(...)"})]
    bare = nbformat.v4.new_code_cell("widgets.VBox([slider])")          # a widget that is not a Panel
    bare.metadata["slideshow"] = {"slide_type": "subslide"}
    bare.outputs = [nbformat.v4.new_output("execute_result", execution_count=2, data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "def", "version_major": 2, "version_minor": 0},
        "text/plain": "VBox(children=(IntSlider(value=3),))"})]
    quiz = nbformat.v4.new_code_cell("quiz = Quiz([Numeric('2+2?', answer=4.0, explanation='four')])")
    quiz.metadata["tags"] = ["quiz"]
    nb.cells = [title, fig, panel, bare, quiz]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "demo.ipynb"
    nbformat.write(nb, path)
    return path


def test_export_is_offline_and_keeps_figures_and_snapshots(tmp_path):
    out = export(_deck_source(tmp_path), tmp_path / "slides", execute=False)
    html = out.read_text(encoding="utf-8")
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs and all(not r.startswith(("http:", "https:", "//")) for r in refs), refs
    for ref in refs:
        if ref.startswith("vendor/"):
            assert (out.parent / ref.split("?")[0]).is_file(), ref           # every local file is there
    assert 'src="vendor/reveal.js/dist/reveal.js"' in html and "vendor/plotly.min.js" in html
    assert "vendor/mathjax/MathJax.js?config=" in html
    assert "Plotly.newPlot" in html                                          # the figure, as a static chart
    assert "labsupport-panel-snapshot" in html and "T = <b>1.00</b>" in html  # the panel, as its snapshot
    assert "VBox(...)" not in html and "VBox(children" not in html           # never the widget's repr
    assert "labsupport-no-snapshot" in html                                  # but a note where a panel was
    assert "require(" not in html and "jquery" not in html.lower()
    assert "answer=4.0" not in html                                          # a quiz's code (answers) is not shown
    # a slide taller than the slide height is fitted or scrolled (checked in a browser by
    # tests/browser_check.py --offline); MathJax's hidden MathML copy gets local fonts only
    assert "var SLIDE_HEIGHT = 800;" in html and "function fitSlide" in html and "ls-scroll" in html
    assert re.search(r"\.MJX_Assistive_MathML \[mathvariant\][^{]*\{ font-family: math, serif", html)


def test_vendored_mathjax_fonts_cover_what_the_deck_asks_for(tmp_path):
    """Every font folder the deck's MathJax configuration names exists in the vendored copy."""
    out = export(_deck_source(tmp_path), tmp_path / "slides", execute=False)
    html = out.read_text(encoding="utf-8")
    web_font = re.search(r'webFont: "([^"]+)"', html).group(1)
    fonts = out.parent / "vendor" / "mathjax" / "fonts" / "HTML-CSS" / web_font / "woff"
    assert len(list(fonts.glob("*.woff"))) >= 20                             # STIX-Web's woff files
    assert (out.parent / "vendor" / "mathjax" / "jax" / "output" / "HTML-CSS" / "fonts" / web_font).is_dir()
    assert 'availableFonts: []' in html and 'imageFont: null' in html        # no TeX fonts or PNG fonts asked for


def test_export_can_keep_the_executed_notebook(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(6 * 7)")
    cell.metadata["slideshow"] = {"slide_type": "slide"}
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "answer.ipynb")
    out = export(tmp_path / "answer.ipynb", tmp_path / "slides", keep_executed=tmp_path / "executed")
    kept = nbformat.read(tmp_path / "executed" / "answer.ipynb", as_version=4)
    assert kept.cells[0].outputs[0]["text"] == "42\n"
    assert "42" in out.read_text(encoding="utf-8")
    again = export(tmp_path / "executed" / "answer.ipynb", tmp_path / "again", execute=False)
    assert "42" in again.read_text(encoding="utf-8")


def test_vendor_install_is_idempotent(tmp_path):
    first = install_vendor(tmp_path)
    stamp = (first / "plotly.min.js").stat().st_mtime_ns
    assert install_vendor(tmp_path) == first
    assert (first / "plotly.min.js").stat().st_mtime_ns == stamp
    assert (first / "reveal.js" / "plugin" / "notes" / "notes.js").is_file()


def test_a_korean_deck_speaks_korean(tmp_path):
    """A chapter of ``chapters-ko/`` exports with ``<html lang="ko">`` and the deck's own words in Korean;
    the English deck stays English."""
    from labsupport.slides import edition_language

    src = _deck_source(tmp_path)
    ko_dir = tmp_path / "chapters-ko"
    ko_dir.mkdir()
    ko_src = ko_dir / src.name
    ko_src.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    assert (edition_language(src), edition_language(ko_src)) == ("en", "ko")
    en_html = export(src, tmp_path / "slides", execute=False).read_text(encoding="utf-8")
    ko_html = export(ko_src, tmp_path / "slides-ko", execute=False).read_text(encoding="utf-8")
    assert '<html lang="en">' in en_html and '<html lang="ko">' in ko_html
    # Korean wraps between words (the rule applies to the lang="ko" page only: the English one ignores it)
    assert re.search(r":lang\(ko\) \.reveal \.jp-RenderedHTMLCommon[^{]*\{[^}]*word-break: keep-all", ko_html)

    def has_badge(page: str, text: str) -> bool:        # the template writes it as a JSON string (\u escapes)
        return json.dumps(text) in page or json.dumps(text, ensure_ascii=False) in page

    assert "run this chapter in JupyterLab" in en_html and has_badge(en_html, "▼ more below")
    assert "이 장을 JupyterLab에서 실행하면" in ko_html and has_badge(ko_html, "▼ 아래에 더 있음")
    assert "run this chapter in JupyterLab" not in ko_html
    kept = tmp_path / "executed"                   # an executed Korean chapter kept elsewhere stays Korean
    kept.mkdir()
    nb = nbformat.read(src, 4)
    nb.cells.insert(0, nbformat.v4.new_code_cell('lm = setup_chapter(seed=0, lang="ko")'))
    nbformat.write(nb, kept / src.name)
    assert edition_language(kept / src.name) == "ko"
