"""Panels draw their figures as plain plotly outputs (``widgets.common.FigureOutput``), never as
``go.FigureWidget`` s: with anywidget 0.11 a FigureWidget whose 5 MB script takes over 2 s to
load drops every later message (its data and layout included) and stays empty axes."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
from test_speculative_variants import random_heads

from labsupport.widgets.common import FigureOutput

_MIME = "application/vnd.plotly.v1+json"


def _widgets(w):
    yield w
    for child in getattr(w, "children", ()):
        yield from _widgets(child)


def assert_drawn(panel, n_figures: int = 1) -> list[dict]:
    """No FigureWidget in the panel; each FigureOutput shows its figure's data, a title, a fixed width."""
    assert not [w for w in _widgets(panel) if isinstance(w, go.FigureWidget)], "a FigureWidget in the panel"
    shown = []
    for out in (w for w in _widgets(panel) if isinstance(w, FigureOutput)):
        (item,) = out.outputs
        fig = item["data"][_MIME]
        assert len(fig["data"]) == len(out.figure.data)                    # what it draws is its figure
        assert any(len(t.get(k) or ()) for t in fig["data"] for k in ("x", "y", "z")), "no data drawn"
        assert fig["layout"]["title"]["text"], "no title drawn"
        assert fig["layout"]["width"] and fig["layout"]["autosize"] is False
        assert "…" not in str([t.get("y") for t in fig["data"]]), "placeholder labels drawn"
        shown.append(fig)
    assert len(shown) == n_figures
    return shown


def test_sampling_panels_draw_plain_outputs(tiny_lm):
    from labsupport.widgets.sampling import sampling_lab, temperature_panel

    panel = temperature_panel(tiny_lm, "Return the number of", temperature=0.7, top_n=5)
    (fig,) = assert_drawn(panel)
    assert "T = 0.7" in fig["layout"]["xaxis2"]["title"]["text"]
    panel.controls["temperature"].value = 0.3
    (fig,) = assert_drawn(panel)
    assert "T = 0.3" in fig["layout"]["xaxis2"]["title"]["text"]
    assert list(fig["data"][1]["x"]) == pytest.approx(list(panel.figure.data[1].x))
    assert_drawn(sampling_lab(tiny_lm, "The default value is", top_k=3, top_n=6))


def test_speculative_structured_and_variants_panels_draw_plain_outputs(tiny_lm):
    from labsupport.widgets.speculative import round_panel, theory_panel
    from labsupport.widgets.speculative_variants import variants_panel
    from labsupport.widgets.structured import structured_lab

    assert_drawn(theory_panel(alpha=0.7, gamma=3, c=0.1, n_rounds=200), 2)
    assert_drawn(round_panel(tiny_lm, tiny_lm, "Return the number", gamma=3, max_new_tokens=8, max_rounds=4))
    assert_drawn(structured_lab(tiny_lm, {"choice": ["yes", "no"]}, "x", top_n=4))
    box = variants_panel(tiny_lm, random_heads(tiny_lm.model.config.n_embd), "Return the", layers=1,
                         max_new_tokens=12)
    assert not [w for w in _widgets(box) if isinstance(w, go.FigureWidget)]


def test_figure_output_keeps_a_fixed_width_unless_the_figure_has_one():
    out = FigureOutput(go.Figure(go.Scatter(x=[0, 1], y=[1, 2]), layout={"title": "a"}), width=700)
    assert out.layout.width == 700 and out.outputs[0]["data"][_MIME]["layout"]["width"] == 700
    out.show(go.Figure(go.Scatter(x=[0]), layout={"width": 500, "title": "b"}))
    assert out.outputs[0]["data"][_MIME]["layout"]["width"] == 500 and out.layout.title.text == "b"


def test_batching_and_paged_panels_draw_plain_outputs():
    from labsupport.sim.fragmentation import Workload
    from labsupport.widgets.batching import batching_lab, disaggregation_lab, step_time_lab
    from labsupport.widgets.paged import fragmentation_lab

    st = step_time_lab()
    (fig,) = assert_drawn(st)
    st.children[0].children[1].value = 1.0                                  # K (GB/request)
    (moved,) = assert_drawn(st)
    assert moved["data"][0]["y"] != fig["data"][0]["y"]                     # the step-time curve was redrawn
    bl = batching_lab(num_requests=16)
    (fig,) = assert_drawn(bl)
    bl.children[0].children[0].children[1].value = 16                       # batch size
    (moved,) = assert_drawn(bl)
    assert moved["layout"]["height"] > fig["layout"]["height"]              # more slots, a taller chart
    assert_drawn(disaggregation_lab(num_requests=20))
    lab = fragmentation_lab(Workload(num_steps=30))
    grid, _ = assert_drawn(lab, 2)
    lab.children[0].children[1].children[0].children[1].value = 3          # the step slider
    grid3, line3 = assert_drawn(lab, 2)
    assert "step 3" in grid3["layout"]["title"]["text"] and grid3["data"][1]["z"] != grid["data"][1]["z"]
    assert line3["layout"]["shapes"][0]["x0"] == 3
