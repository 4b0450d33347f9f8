"""Figure builders and panels of the PagedAttention and batching chapters (no browser, no model)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from labsupport import serving_math as sm
from labsupport.engine.metrics import RequestMetrics
from labsupport.sim import batching as sb
from labsupport.sim import fragmentation as sf
from labsupport.sim import timeline as tl
from labsupport.viz import batching as vb
from labsupport.viz import paged as vp


def test_memory_image_colours_and_text():
    owner = np.array([-1, 0, 0, 1])
    used = np.array([False, True, False, True])
    img, text = vp.memory_image(owner, used, columns=2)
    assert img.shape == (2, 2, 3) and img.dtype == np.uint8
    assert tuple(img[0, 0]) == (255, 255, 255)                       # free
    dark, light = img[0, 1].astype(int), img[1, 0].astype(int)
    assert dark.sum() < light.sum() < 3 * 255                        # used darker than held-but-empty
    assert text[0, 0] == "free" and "KV" in text[0, 1] and "empty" in text[1, 0]
    with pytest.raises(ValueError):
        vp.memory_image(owner, used, columns=3)


def test_fragmentation_figures():
    runs = sf.compare(sf.Workload(num_steps=20), 16)
    grids = {n: (r.owner[10], r.used[10]) for n, r in runs.items()}
    counters = {n: {"running": int(r.running[10]), "queued": int(r.queued[10]), "waste": float(r.waste[10]),
                    "completed": int(r.completed[10])} for n, r in runs.items()}
    fig = vp.fragmentation_figure(grids, counters, 10, block_sizes={"contiguous": 256, "paged": 16})
    assert isinstance(fig, go.Figure) and len(fig.data) == 2
    assert len(fig.layout.shapes) == 3 + 3                             # 3 horizontal (256 = 4 rows), 3 vertical
    assert vp.block_boundaries(16, 1024) == [(15.5, -0.5, 15.5, 15.5), (31.5, -0.5, 31.5, 15.5),
                                             (47.5, -0.5, 47.5, 15.5)]
    assert vp.block_boundaries(1, 1024) == [] and vp.block_boundaries(96, 1024) == []
    assert fig.data[0].z.shape == (16, 64, 3)
    assert "contiguous" in fig.layout.annotations[0].text and "paged" in fig.layout.annotations[1].text
    series = {n: {"running": r.running, "queued": r.queued, "waste": r.waste, "completed": r.completed}
              for n, r in runs.items()}
    lines = vp.fragmentation_counters_figure(series, step=5)
    assert len(lines.data) == 8 and len(lines.layout.shapes) == 4
    assert lines.layout.font.size >= 14


def test_block_table_figure_marks_shared_blocks():
    fig = vp.block_table_figure({"a": [0, 1, 2], "b": [0, 1, 3]}, num_blocks=8, num_tokens={"a": 10, "b": 9},
                                block_size=4, request_ids=["a", "b", "c"])
    left, pool = fig.data[0], fig.data[1]
    assert list(left.text[1:]) == ["0", "1", "2", "0", "1", "3"]
    assert list(pool.text[:4]) == ["0<br>×2", "1<br>×2", "2", "3"]
    assert pool.marker.color[0] == vp.SHARED and pool.marker.color[2] == vp.request_colour(0)
    assert pool.marker.color[3] == vp.request_colour(1) and pool.marker.color[7] == "#f4f4f4"
    assert [t.name for t in fig.data[2:]] == ["a", "b", "c", "shared (ref > 1)"]
    assert "2/4 slots filled" in left.hovertext[3]
    with pytest.raises(ValueError):
        vp.block_table_figure({"a": [9]}, num_blocks=8)


def test_tradeoff_sharing_prefix_reservation_figures():
    rows = [{"block_size": 1, "waste": 0.0, "table_entries": 90.0}, {"block_size": 16, "waste": 0.07,
                                                                    "table_entries": 6.0}]
    fig = vp.block_size_tradeoff_figure(rows, measured_ms={1: 30.0, 16: 10.0})
    assert list(fig.data[0].y) == pytest.approx([0.0, 7.0]) and len(fig.data) == 3
    assert list(vp.sharing_figure(["n=4"], [40], [16]).data[1].y) == [16]
    fig = vp.prefix_cache_figure(["0", "1"], [10.0, 9.0], [10.0, 3.0], [100, 100], [100, 20])
    assert len(fig.data) == 4
    fig = vp.reservation_figure(sm.reservation_report())
    assert list(fig.data[1].y) == [234, 1600, 1578]


def test_batching_figures():
    lens = list(sm.BIMODAL_OUTPUT_LENS)
    runs = {p: sb.simulate_batching(lens, 8, p) for p in sb.POLICIES}
    fig = vb.slot_gantt_figure({p: r.segments for p, r in runs.items()}, 8, lengths=dict(enumerate(lens)))
    assert len(fig.data) == 4
    bars = fig.data[1]
    assert sorted(bars.x) == sorted(lens)                              # one bar per request, its length
    assert set(bars.marker.color) == {"#1f77b4", "#ff7f0e"}
    b = list(range(1, 65))
    fig = vb.step_time_figure(b, [1.0 + x for x in b], [x / (1 + x) for x in b], ceiling=1.0, marks=(1, 64))
    assert len(fig.data) == 6
    fig = vb.measured_step_figure([1, 2, 4], [1.0, 1.5, 2.5], [1.0, 1.5, 2.5])
    assert list(fig.data[2].y) == [1000.0, 2000 / 1.5, 1600.0]


def test_timeline_and_latency_figures():
    states = {"a": ["prefill", "decode", "finished"], "b": ["waiting", "swapped", "decode"]}
    fig = vb.request_timeline_figure(states, preempted={"b": [1]})
    assert fig.data[0].z.tolist() == [[2, 3, 5], [1, 4, 3]]
    assert fig.data[-1].name == "preempted" and list(fig.data[-1].x) == [1]
    fig = vb.token_latency_figure({"off": {"r0": ([0.1, 0.2], [5.0, 50.0])}, "on": {"r0": ([0.1], [5.0])}})
    assert len(fig.data) == 2
    fig = vb.latency_scatter_figure({"B=1": ([10.0], [2.0])}, ttft_slo_ms=50, tpot_slo_ms=5)
    assert fig.layout.shapes[0].x1 == 50
    fig = vb.goodput_bars_figure(["B=1"], [2.0], [1.0])
    assert list(fig.data[1].y) == [1.0]
    fig = vb.latency_summary_figure({"x": {"TTFT p50": 1.0, "max ITL": 2.0}}, "t")
    assert list(fig.data[0].x) == ["TTFT p50", "max ITL"]


@pytest.mark.slow
def test_panels_build_and_react():
    from labsupport.widgets import batching as wb
    from labsupport.widgets import paged as wp

    lab = wp.fragmentation_lab(sf.Workload(num_steps=30))
    sliders = lab.children[0].children[0].children
    step = lab.children[0].children[1].children[0].children[1]
    grid = lab.children[1]
    before = grid.data[1].z.copy()
    step.value = 5
    assert not np.array_equal(before, grid.data[1].z)
    sliders[1].value = 64                                               # block size
    assert "block tables" in lab.children[0].children[1].children[1].value
    frames = [tl.frame_from_snapshot(type("S", (), {"step": k, "time": 0.0, "block_tables": {"0": list(range(k + 1))},
                                                        "num_slots": {"0": 4 * k + 1}, "ref_counts": [1] * 8,
                                                        "scheduled_tokens": {"0": 1}, "waiting": [], "swapped": [],
                                                        "finished": [], "preempted": [], "num_free_blocks": 0})())
              for k in range(3)]
    stepper = wp.block_table_stepper(frames, num_blocks=8, block_size=4)
    stepper.children[0].value = 0
    shown = stepper.children[2].outputs[0]["data"]["application/vnd.plotly.v1+json"]
    assert list(shown["data"][0]["text"][1:]) == ["0"] and "step 0" in shown["layout"]["title"]["text"]
    assert stepper.children[0].label == "step 0"

    bl = wb.batching_lab(num_requests=16)
    bl.children[0].children[0].children[0].value = 0.0                  # no spread: static = continuous
    assert "speed-up simulated ×1.00" in bl.children[0].children[1].value
    m = [RequestMetrics(0.0, first_token_time=0.1, token_times=[0.1, 0.11, 0.12], finish_time=0.12)]
    gl = wb.goodput_lab({"B=1": m}, ttft_slo_ms=50)
    assert "0/1 requests" in gl.children[1].value
    gl.children[0].children[0].value = 150
    assert "1/1 requests" in gl.children[1].value
    st = wb.step_time_lab()
    assert "t(1) = 4.92 ms" in st.children[1].value
    dl = wb.disaggregation_lab(num_requests=20)
    assert len(dl.children[1].data) == 3


def test_an_empty_memory_map_says_empty():
    """A memory with no request in it is all white: the figure says so instead of looking broken."""
    import numpy as np

    from labsupport.viz.paged import fragmentation_figure

    free = (np.full(128, -1), np.zeros(128, bool))
    busy = (np.array([0] * 16 + [-1] * 112), np.array([True] * 10 + [False] * 118))
    c = {"running": 0, "queued": 0, "waste": 0.0, "completed": 3}
    fig = fragmentation_figure({"contiguous": free, "paged": busy}, {"contiguous": c, "paged": c}, 100)
    notes = [a.text for a in fig.layout.annotations if "empty" in a.text]
    assert notes == ["empty: no request holds memory"]            # the empty one only
