"""goodput_lab draws plain plotly outputs (no FigureWidget, which rendered as empty axes after
"Restart Kernel and Run All" in JupyterLab) and redraws them from the sliders."""

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
