"""Figures and panels of the beam-search and KV-cache chapters, built without a browser."""

import ipywidgets as widgets
import plotly.graph_objects as go
import pytest

from labsupport import kv
from labsupport.beam import beam_search
from labsupport.viz.beam import TREE_TRACES, beam_tree_figure, length_penalty_figure, text_width_px
from labsupport.viz.kv import (
    kv_cells_figure,
    kv_counts_figure,
    memory_figure,
    request_timeline_figure,
    step_time_figure,
    timing_figure,
)
from labsupport.widgets.beam import PLOTLY_MIME, beam_explorer
from labsupport.widgets.kv import kv_cache_animation, kv_memory_calculator


def _fonts_ok(fig: go.Figure) -> None:
    assert fig.layout.font.size >= 14
    assert fig.layout.title.text


# ----------------------------------------------------------------------------- beam

def test_beam_tree_figure_marks_beams_pruned_finished_and_best(tiny_lm):
    res = beam_search(tiny_lm, "Return the number of", 3, max_new_tokens=4, ignore_eos=True)
    fig = beam_tree_figure(res, max_children=2)
    _fonts_ok(fig)
    assert tuple(t.name for t in fig.data) == TREE_TRACES
    by_name = {t.name: t for t in fig.data}
    kept = [n for n in res.nodes if n.status == "kept"]
    finished = [n for n in res.nodes if n.status == "finished"]
    assert len(by_name["beam"].x) == len(kept)
    assert len(by_name["finished"].x) == len(finished) == 3
    assert len(by_name["pruned"].x) > 0
    # the best path: one segment (3 entries with a None gap) per generated token, ending at depth 4
    assert len(by_name["best path"].x) == 3 * res.best.length and max(x for x in by_name["best path"].x
                                                                         if x is not None) == 4
    assert any(f"({res.best.log2prob:.1f})" in t for t in by_name["finished"].text)
    assert by_name["pruned"].opacity < 1
    assert by_name["best path"].line.width > by_name["beam edges"].line.width
    with pytest.raises(ValueError, match="max_children"):
        beam_tree_figure(res, max_children=0)


def _label_boxes(fig: go.Figure):
    """Each drawn label's box and each marker's centre, in pixels of the plot area (y downwards).

    Mapping data to pixels from the figure's own width, height, margins and axis ranges; a label
    starts right of its marker ("middle right") and is as wide as ``text_width_px`` says (that
    estimate is generous: Chromium draws these labels at 65-95 % of it).
    """
    lay = fig.layout
    plot_w = lay.width - lay.margin.l - lay.margin.r
    plot_h = lay.height - lay.margin.t - lay.margin.b
    (x0, x1), (y0, y1) = lay.xaxis.range, lay.yaxis.range

    def px(x, y):
        return (x - x0) / (x1 - x0) * plot_w, (y1 - y) / (y1 - y0) * plot_h

    boxes, markers = [], []
    for trace in fig.data:
        if "markers" not in (trace.mode or ""):
            continue
        size = trace.textfont.size or lay.font.size
        for k, (x, y) in enumerate(zip(trace.x, trace.y)):
            cx, cy = px(x, y)
            markers.append((cx, cy, (trace.marker.size or 6) / 2))
            text = trace.text[k] if trace.text and trace.name != "prompt" else ""
            if text:
                left = cx + (trace.marker.size or 6) / 2 + 2
                boxes.append((text, size, left, cy - 0.6 * size, left + text_width_px(text, size), cy + 0.6 * size))
    return boxes, markers, plot_w, plot_h


@pytest.mark.parametrize(("width", "depth"), [(6, 8), (6, 1), (1, 8), (3, 5)])
def test_beam_tree_labels_never_overlap_at_the_panels_largest_settings(tiny_lm, width, depth):
    res = beam_search(tiny_lm, "Return the number of", width, max_new_tokens=depth, ignore_eos=True)
    fig = beam_tree_figure(res, max_children=3, prompt_label="Return the number of", width=940)
    boxes, markers, plot_w, plot_h = _label_boxes(fig)
    assert len(boxes) == sum(1 for n in res.nodes if n.status in ("kept", "finished"))   # every beam labelled
    assert min(size for _, size, *_ in boxes) >= 11
    for i, (text, _, l1, t1, r1, b1) in enumerate(boxes):
        assert 0 <= l1 and r1 <= plot_w and 0 <= t1 and b1 <= plot_h, (text, l1, r1)   # not clipped by the axes
        for text2, _, l2, t2, r2, b2 in boxes[i + 1:]:
            assert not (l1 < r2 and l2 < r1 and t1 < b2 and t2 < b1), (text, text2)      # no two labels overlap
        for cx, cy, radius in markers:                                                    # nor a label and a node
            assert not (l1 < cx + radius and cx - radius < r1 and t1 < cy + radius and cy - radius < b1), (text, cx, cy)
    root = next(t for t in fig.data if t.name == "prompt")
    assert fig.layout.xaxis.range[0] < root.x[0] and "Return the number of" in root.hovertext[0]
    last = next(t for t in fig.data if t.name == "finished")
    assert all(f"({n.cum_log2:.1f})" in label for n, label in zip(
        [n for n in res.nodes if n.status == "finished"], last.text))                    # final scores always shown


def test_beam_tree_shortened_label_keeps_the_full_token_in_its_hover(tiny_lm):
    res = beam_search(tiny_lm, "Return the number of", 6, max_new_tokens=8, ignore_eos=True)
    node = next(n for n in res.nodes if n.status == "kept" and n.depth == 1)
    node.token = "an_unusually_long_token_text"                   # wider than any column at depth 8
    beams = next(t for t in beam_tree_figure(res, width=940).data if t.name == "beam")
    k = list(beams.hovertext).index(next(h for h in beams.hovertext if "an_unusually_long_token_text" in h))
    assert beams.text[k].endswith("…") and beams.text[k] != node.token


def test_eos_finished_node_is_a_square(tiny_lm):
    from labsupport.generation import generate
    from labsupport.sampling import GREEDY
    eos = generate(tiny_lm, "Return the number of", GREEDY, max_new_tokens=3).token_ids[1]
    res = beam_search(tiny_lm, "Return the number of", 2, max_new_tokens=4, length_penalty=0.0, eos_token_id=eos)
    fig = beam_tree_figure(res)
    fin = next(t for t in fig.data if t.name == "finished")
    symbols = fin.marker.symbol if isinstance(fin.marker.symbol, tuple) else (fin.marker.symbol,)
    reasons = [n.finish_reason for n in res.nodes if n.status == "finished"]
    assert "stop" in reasons
    assert [s == "square" for s in symbols] == [r == "stop" for r in reasons]


def test_length_penalty_figure_lines_cross():
    fig = length_penalty_figure([("A", -2.0, 2), ("B", -3.0, 4)], alphas=[0.0, 1.0, 2.0], marked_alpha=1.0)
    _fonts_ok(fig)
    a, b = fig.data
    assert list(a.y) == [-2.0, -1.0, -0.5] and list(b.y) == [-3.0, -0.75, -0.1875]
    with pytest.raises(ValueError):
        length_penalty_figure([])


def _shown(out: widgets.Output) -> dict:
    """The plotly figure (as JSON) an Output panel area shows: exactly one display."""
    (display,) = out.outputs
    return display["data"][PLOTLY_MIME]


def test_beam_explorer_redraws(tiny_lm):
    panel = beam_explorer(tiny_lm, prompt="Return the number of", beam_width=2, depth=3)
    assert isinstance(panel, widgets.VBox)
    controls, tree, summary, out = panel.children
    assert "beam search" in summary.value and "greedy" in summary.value
    fig = _shown(tree)
    assert [t["name"] for t in fig["data"]] == list(TREE_TRACES)
    before = len(fig["data"][4]["x"])                # live beams drawn
    width = controls.children[1].children[0]
    width.value = 4                                  # the observer runs in Python, no browser needed
    fig = _shown(tree)
    assert len(fig["data"][4]["x"]) > before
    assert "B = 4" in fig["layout"]["title"]["text"]
    controls.children[0].value = ""                  # empty prompt: a message, not a traceback
    assert "prompt" in str(out.outputs)
    assert "B = 4" in _shown(tree)["layout"]["title"]["text"]     # the last good tree stays


# ----------------------------------------------------------------------------- KV cache

def test_kv_counts_and_cells_figures_match_the_counting():
    fig = kv_counts_figure(12, 28)
    _fonts_ok(fig)
    none, cache, _marks = fig.data
    assert none.y[-1] == 754 and cache.y[-1] == 40
    assert "18.85×" in fig.layout.title.text
    cells = kv_cells_figure(12, 28, 5)
    computed, reused, future = cells.data
    assert sorted(zip(computed.y, computed.x)) == [(0, 16)] + [(1, p) for p in range(17)]
    assert len(reused.x) == 16 and len(future.x) == 2 * (40 - 17)
    prefill = kv_cells_figure(12, 28, 0)
    assert len(prefill.data[0].x) == 24 and len(prefill.data[1].x) == 0
    with pytest.raises(ValueError, match="step"):
        kv_cells_figure(12, 28, 29)
    with pytest.raises(TypeError, match="step"):
        kv_cells_figure(12, 28, 2.0)
    with pytest.raises(ValueError, match="prompt_len"):
        kv_counts_figure(0, 5)


def test_memory_figure_calculator():
    fig = memory_figure(kv.preset("Llama 3 8B"), 131_072, 1)
    _fonts_ok(fig)
    weights, kv_bar = fig.data
    assert dict(zip(kv_bar.y, kv_bar.text)) == {"MQA (H_kv=1)": "2 GiB", "GQA (H_kv=8)": "16 GiB",
                                                "MHA (H_kv=32)": "64 GiB"}
    assert all(w == pytest.approx(16.06, abs=0.01) for w in weights.x)
    assert fig.layout.shapes[0].x0 == 80
    with pytest.raises(ValueError, match="attention"):
        memory_figure(kv.preset("Llama 3 8B"), 8192, attention="MLA")


def test_step_time_and_timing_figures():
    fig = step_time_figure(16e9, 0.25e9, 3.3e12)
    _fonts_ok(fig)
    marks = fig.data[3]
    assert [round(t, 1) for t in marks.y] == [4.9, 9.7, 23.0]
    assert fig.data[2].y[0] == pytest.approx(13_200)
    t = timing_figure([16, 32], [0.2, 0.5], [0.1, 0.2])
    _fonts_ok(t)
    with pytest.raises(ValueError):
        timing_figure([16], [0.1, 0.2], [0.1])
    line = request_timeline_figure([0.02, 0.022, 0.024], 256)
    assert "TTFT 20.0 ms" in line.layout.title.text and "2.00 ms" in line.layout.title.text
    with pytest.raises(ValueError):
        request_timeline_figure([], 1)


def test_kv_panels_build_and_update():
    anim = kv_cache_animation(12, 28, step=28)
    sliders, player, numbers, cells, counts, _error = anim.children
    assert "18.85×" in numbers.value
    assert _shown(counts)["data"][0]["y"][-1] == 754
    _P, n = sliders.children
    n.value = 10
    step = player.children[1]
    assert step.max == 10 and _shown(counts)["data"][0]["y"][-1] == kv.kv_positions_computed(12, 10, False)
    step.value = 3
    assert "step 3" in numbers.value
    assert "decode step 3" in _shown(cells)["layout"]["title"]["text"]

    calc = kv_memory_calculator("Llama 3 8B", seq_len=131_072)
    (model, attention), precision, summary, chart = (
        calc.children[0].children, calc.children[1], calc.children[3], calc.children[4])
    assert "16 GiB" in summary.value and "128 KiB" in summary.value
    attention.value = "MHA"
    assert "64 GiB" in summary.value
    assert "64 GiB" in _shown(chart)["data"][1]["text"]
    precision.value = "int4"
    assert "16 GiB" in summary.value
    model.value = "GPT-2 small"
    assert attention.value == "MHA" and "36 KiB" not in summary.value      # int4: 9 KiB per token
    assert "9 KiB" in summary.value
    with pytest.raises(ValueError, match="preset"):
        kv_memory_calculator("GPT-5")
