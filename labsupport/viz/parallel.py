"""Figures of the parallelism chapter: TP compute vs communication, the pipeline timeline and
its bubble, expert load, and the cluster cost model.

Pure functions ``data → go.Figure`` (no widgets); measured data come in as plain numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..i18n import tr
from ..parallel.cost_model import StepEstimate
from .style import FONT

RED, BLUE, GREY, GREEN, ORANGE, PURPLE = "#d62728", "#1f77b4", "#bdbdbd", "#2ca02c", "#ff7f0e", "#9467bd"
STAGE_COLOURS = [BLUE, ORANGE, GREEN, PURPLE, RED]


def tp_time_figure(labels: Sequence[str], compute_s: Sequence[float], comm_s: Sequence[float]) -> go.Figure:
    """Stacked bars: compute and communication milliseconds of a decode step, one bar per run.

    Raises:
        ValueError: lists of different lengths or empty.
    """
    if not labels or not len(labels) == len(compute_s) == len(comm_s):
        raise ValueError("labels, compute_s and comm_s must be non-empty and equally long")
    fig = go.Figure()
    fig.add_trace(go.Bar(x=list(labels), y=[c * 1e3 for c in compute_s], name=tr("compute"), marker_color=BLUE,
                         text=[f"{c * 1e3:.1f}" for c in compute_s], textposition="inside"))
    fig.add_trace(go.Bar(x=list(labels), y=[c * 1e3 for c in comm_s], name=tr("all-reduce (communication)"),
                         marker_color=RED, text=[f"{c * 1e3:.1f}" for c in comm_s], textposition="inside"))
    fig.update_layout(barmode="stack", template="plotly_white", font=FONT, height=380,
                      title={"text": tr("One decode step of tiny-gpt2, median (ms)"), "font": {"size": 17}})
    fig.update_yaxes(title=tr("milliseconds per decode step"))
    return fig


def pipeline_timeline_figure(events: Sequence[Sequence[tuple[float, float]]], title: str = "") -> go.Figure:
    """Gantt chart of a pipeline run: one row per stage, one bar per micro-batch's compute.

    Args:
        events: per stage, the ``(start, end)`` seconds of each micro-batch (one clock).

    Raises:
        ValueError: no events.
    """
    starts = [a for stage in events for a, _ in stage]
    if not starts:
        raise ValueError("events must hold at least one interval")
    t0 = min(starts)
    fig = go.Figure()
    hover = tr("micro-batch {mb}: {start} → +{length} ms", mb="%{text}", start="%{base:.1f}",
               length="%{x:.1f}") + "<extra></extra>"
    for s, stage in enumerate(events):
        row = tr("stage {s}", s=s)
        fig.add_trace(go.Bar(
            y=[row] * len(stage), x=[(b - a) * 1e3 for a, b in stage], base=[(a - t0) * 1e3 for a, _ in stage],
            orientation="h", name=row, marker={"color": STAGE_COLOURS[s % len(STAGE_COLOURS)],
                                                        "line": {"color": "white", "width": 1}},
            text=[f"mb {j}" for j in range(len(stage))], textposition="inside", showlegend=False,
            hovertemplate=hover))
    fig.update_layout(template="plotly_white", font=FONT, height=260, barmode="overlay",
                      title={"text": title or tr("Pipeline timeline (white space = bubble)"), "font": {"size": 17}})
    fig.update_xaxes(title=tr("milliseconds since the start"), rangemode="tozero")
    fig.update_yaxes(autorange="reversed")
    return fig


def bubble_figure(microbatches: Sequence[int], measured: Sequence[float], equal_stages: Sequence[float],
                  measured_stages: Sequence[float] | None = None) -> go.Figure:
    """Bubble fraction vs micro-batches: measured (markers), GPipe's ``(p−1)/(m+p−1)``, and the
    same schedule with the measured (unequal) stage times.

    Raises:
        ValueError: lists of different lengths.
    """
    if not len(microbatches) == len(measured) == len(equal_stages):
        raise ValueError("microbatches, measured and equal_stages must be equally long")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(microbatches), y=list(equal_stages), mode="lines+markers",
                             name=tr("(p − 1)/(m + p − 1), equal stages"), line={"color": GREY, "width": 3, "dash": "dash"}))
    if measured_stages is not None:
        fig.add_trace(go.Scatter(x=list(microbatches), y=list(measured_stages), mode="lines+markers",
                                 name=tr("same schedule, measured stage times"), line={"color": ORANGE, "width": 2}))
    fig.add_trace(go.Scatter(x=list(microbatches), y=list(measured), mode="markers+text", name=tr("measured"),
                             text=[f"{b:.2f}" for b in measured], textposition="top right",
                             marker={"size": 13, "color": RED}))
    fig.update_layout(template="plotly_white", font=FONT, height=380,
                      title={"text": tr("Pipeline bubble, 2 stages"), "font": {"size": 17}})
    fig.update_xaxes(title=tr("micro-batches m"), type="log", tickvals=list(microbatches))
    fig.update_yaxes(title=tr("idle share of p × makespan"), range=[0, 1])
    return fig


def expert_load_figure(load: Sequence[int], experts_per_rank: int) -> go.Figure:
    """Token copies routed to each expert, coloured by the rank that holds it; the mean as a line.

    Raises:
        ValueError: empty ``load`` or ``experts_per_rank`` < 1.
    """
    if not load or experts_per_rank < 1:
        raise ValueError("load must be non-empty and experts_per_rank >= 1")
    mean = sum(load) / len(load)
    fig = go.Figure(go.Bar(x=[tr("expert {e} (rank {rank})", e=e, rank=e // experts_per_rank) for e in range(len(load))], y=list(load),
                           marker_color=[STAGE_COLOURS[(e // experts_per_rank) % 5] for e in range(len(load))],
                           text=list(load), textposition="outside", showlegend=False))
    fig.add_hline(y=mean, line={"color": GREY, "dash": "dash"}, annotation_text=tr("mean {mean:.1f}", mean=mean))
    fig.update_layout(template="plotly_white", font=FONT, height=360,
                      title={"text": tr("Router load: max / mean = {ratio:.2f}", ratio=max(load) / mean), "font": {"size": 17}})
    fig.update_yaxes(title=tr("token copies (top-k)"), range=[0, max(load) * 1.2])
    return fig


def cluster_figure(estimates: Sequence[StepEstimate], chosen: StepEstimate, title: str = "",
                   calibration: dict | None = None) -> go.Figure:
    """Left: decode-step time split (weights, KV, TP all-reduce, PP hops) for each TP degree;
    right: memory per GPU against its capacity. The chosen layout is outlined.

    Args:
        estimates: one :class:`StepEstimate` per TP degree (same PP).
        chosen: the layout of the sliders.
        calibration: optional ``{"tp": [...], "measured_ms": [...]}`` drawn as markers (measured points).

    Raises:
        ValueError: no estimates.
    """
    if not estimates:
        raise ValueError("estimates must hold at least one layout")
    fig = make_subplots(rows=1, cols=2, subplot_titles=(tr("decode step (ms)"), tr("memory per GPU (GB)")),
                        horizontal_spacing=0.12)
    xs = [f"TP {e.tp}" for e in estimates]
    outline = [3 if e.tp == chosen.tp else 0 for e in estimates]
    for name, attr, colour in ((tr("weights read"), "weights_s", BLUE), (tr("KV read"), "kv_s", GREEN),
                               (tr("TP all-reduce"), "tp_comm_s", RED), (tr("PP hops"), "pp_comm_s", ORANGE)):
        fig.add_trace(go.Bar(x=xs, y=[getattr(e, attr) * 1e3 for e in estimates], name=name, marker_color=colour,
                             marker_line={"width": outline, "color": "black"}), row=1, col=1)
    fig.add_trace(go.Bar(x=xs, y=[e.memory_per_gpu / 1e9 for e in estimates], name=tr("weights + KV per GPU"),
                         marker_color=[PURPLE if e.fits else RED for e in estimates],
                         marker_line={"width": outline, "color": "black"}, showlegend=False), row=1, col=2)
    fig.add_hline(y=chosen.capacity / 1e9, line={"color": "black", "dash": "dash"}, row=1, col=2,
                  annotation_text=f"{chosen.capacity / 1e9:.0f} GB")
    if calibration:
        fig.add_trace(go.Scatter(x=[f"TP {t}" for t in calibration["tp"]], y=list(calibration["measured_ms"]),
                                 mode="markers", name=tr("measured on this CPU"),
                                 marker={"symbol": "x", "size": 16, "color": "black"}), row=1, col=1)
    fig.update_layout(barmode="stack", template="plotly_white", font=FONT, height=420,
                      title={"text": title, "font": {"size": 16}}, legend={"orientation": "h", "y": -0.15})
    return fig
