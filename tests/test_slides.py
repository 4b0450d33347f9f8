"""Offline slide export: every script and style sheet is a local file; figures and panel snapshots survive."""

from __future__ import annotations

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
    quiz = nbformat.v4.new_code_cell("quiz = Quiz([Numeric('2+2?', answer=4.0, explanation='four')])")
    quiz.metadata["tags"] = ["quiz"]
    nb.cells = [title, fig, panel, quiz]
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
    assert "VBox(...)" not in html                                           # never the widget's repr
    assert "require(" not in html and "jquery" not in html.lower()
    assert "answer=4.0" not in html                                          # a quiz's code (answers) is not shown


def test_vendor_install_is_idempotent(tmp_path):
    first = install_vendor(tmp_path)
    stamp = (first / "plotly.min.js").stat().st_mtime_ns
    assert install_vendor(tmp_path) == first
    assert (first / "plotly.min.js").stat().st_mtime_ns == stamp
    assert (first / "reveal.js" / "plugin" / "notes" / "notes.js").is_file()
