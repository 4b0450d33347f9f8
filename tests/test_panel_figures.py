"""Panels whose figures are plain plotly outputs redrawn from the controls: in JupyterLab their
FigureWidgets rendered as empty axes (browser check, "Run All" and "Restart Kernel and Run All")."""

import plotly.graph_objects as go

from labsupport.engine.metrics import RequestMetrics, goodput
from labsupport.widgets import batching as wb

PLOTLY = "application/vnd.plotly.v1+json"


def _shown(out):
    (item,) = out.outputs
    return item["data"][PLOTLY]


def test_goodput_panel_figures_are_outputs_that_follow_the_slo_sliders():
    fast = RequestMetrics(0.0, first_token_time=0.1, token_times=[0.1, 0.11, 0.12], finish_time=0.12)
    slow = RequestMetrics(0.0, first_token_time=0.4, token_times=[0.4, 0.45, 0.5], finish_time=0.5)
    results = {"A": [fast], "B": [slow]}
    panel = wb.goodput_lab(results, ttft_slo_ms=200, tpot_slo_ms=20)
    scatter_out, bars_out = panel.children[2].children
    assert not any(isinstance(w, go.FigureWidget) for w in panel.children[2].children)
    bars = _shown(bars_out)
    assert list(bars["data"][1]["y"]) == [goodput(results["A"], 0.2, 0.02), 0.0]
    panel.children[0].children[0].value = 450                # TTFT SLO 450 ms: B's request meets it now
    panel.children[0].children[1].value = 60
    bars = _shown(bars_out)
    assert list(bars["data"][1]["y"]) == [goodput(results["A"], 0.45, 0.06), goodput(results["B"], 0.45, 0.06)]
    assert bars["data"][1]["y"][1] > 0
    shape = _shown(scatter_out)["layout"]["shapes"][0]
    assert (shape["x1"], shape["y1"]) == (450, 60)
    assert panel.error.value == ""


def test_theory_panel_figures_are_outputs_redrawn_by_the_sliders():
    from labsupport.widgets.speculative import theory_panel

    panel = theory_panel(alpha=0.8, gamma=4, c=0.1, n_rounds=200)
    curve_out, strip_out = panel.figures
    assert not any(isinstance(f, go.FigureWidget) for f in panel.figures)
    before = _shown(curve_out)
    panel.controls["alpha"].value = 0.5
    after = _shown(curve_out)
    assert after["data"] and after != before
    assert _shown(strip_out)["data"]
    assert [list(t.y) for t in curve_out.data] == [list(t["y"]) for t in after["data"]]


def test_structured_lab_figure_is_an_output_redrawn_after_a_forced_token(tiny_lm):
    from labsupport.widgets.structured import structured_lab

    panel = structured_lab(tiny_lm, {"json": {"type": "object", "properties": {"a": {"type": "integer"}},
                                              "required": ["a"]}}, "x", seed=1, max_complete=10)
    assert not isinstance(panel.figure, go.FigureWidget)
    before = _shown(panel.figure)
    assert before["data"]
    panel.force_text('{"a":')
    panel.update()
    after = _shown(panel.figure)
    assert after["data"] and after != before
