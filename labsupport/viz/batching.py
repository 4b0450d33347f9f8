"""Figures for the batching chapter: step-time model, slot Gantt charts, request timelines,
per-token latency, TTFT/TPOT/goodput, disaggregation. Pure functions ``data → go.Figure``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..i18n import tr
from ..validation import check_bool, check_int
from . import checks
from .paged import request_colour
from .style import style

STATE_COLOURS = {"not arrived": "#ffffff", "waiting": "#f2c14e", "prefill": "#9467bd", "decode": "#1f77b4",
                 "swapped": "#ff7f0e", "finished": "#e6e6e6"}


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    return style(fig, title, height, annotation_size=16)


def _state_names() -> dict[str, str]:
    """A request's states (:data:`labsupport.sim.timeline.STATES`) as the reader reads them."""
    return {"not arrived": tr("not arrived"), "waiting": tr("waiting"), "prefill": tr("prefill"),
            "decode": tr("decode"), "swapped": tr("swapped"), "finished": tr("finished")}


def step_time_figure(batches: Sequence[int], step_ms: Sequence[float], tokens_per_s: Sequence[float],
                     ceiling: float | None = None, marks: Sequence[int] = (),
                     title: str | None = None) -> go.Figure:
    """Step time and throughput vs batch size, optionally with the ``BW/K`` ceiling.

    Args:
        batches: batch sizes ``B``.
        step_ms: ``t(B)`` in milliseconds.
        tokens_per_s: ``B / t(B)``.
        ceiling: throughput limit ``BW / K`` (tokens/s), drawn dashed.
        marks: batch sizes to label on both curves.
        title: default "Step time t(B) = (W + B·K) / BW" (in the reader's language).

    Raises:
        TypeError / ValueError: a column empty, not finite, negative, or of another length.
    """
    if title is None:
        title = tr("Step time t(B) = (W + B·K) / BW")
    batches = checks.series("batches", batches, low=1)
    step_ms = checks.series("step_ms", step_ms, low=0, length=len(batches), length_of="batches")
    tokens_per_s = checks.series("tokens_per_s", tokens_per_s, low=0, length=len(batches), length_of="batches")
    ceiling = checks.optional_real("ceiling", ceiling, low=0)
    checks.text("title", title)
    marks = [check_int("marks[i]", m) for m in marks]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(tr("step time (ms)"), tr("throughput (tokens/s)")),
                        horizontal_spacing=0.12)
    fig.add_trace(go.Scatter(x=list(batches), y=list(step_ms), mode="lines", line={"width": 3}, name="t(B)",
                             showlegend=False), row=1, col=1)
    fig.add_trace(go.Scatter(x=list(batches), y=list(tokens_per_s), mode="lines", line={"width": 3},
                             name="B / t(B)", showlegend=False), row=1, col=2)
    if ceiling is not None:
        fig.add_hline(y=ceiling, line={"dash": "dash", "color": "#d62728"}, row=1, col=2,
                      annotation_text=tr("BW/K ≈ {rate:,.0f} tok/s", rate=ceiling), annotation_position="bottom right")
    idx = {b: i for i, b in enumerate(batches)}
    for k, b in enumerate(m for m in marks if m in idx):
        i = idx[b]
        pos = "top right" if k == 0 else "top left"              # the first mark sits in the corner
        fig.add_trace(go.Scatter(x=[b], y=[step_ms[i]], mode="markers+text", text=[f"{step_ms[i]:.1f} ms"],
                                 textposition=pos, marker={"size": 10, "color": "black"}, showlegend=False),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=[b], y=[tokens_per_s[i]], mode="markers+text", text=[f"{tokens_per_s[i]:,.0f}"],
                                 textposition=pos, marker={"size": 10, "color": "black"}, showlegend=False),
                      row=1, col=2)
    for c in (1, 2):
        fig.update_xaxes(title_text=tr("batch size B (requests)"), row=1, col=c)
    return _layout(fig, title, height=440)


def measured_step_figure(batches: Sequence[int], measured_ms: Sequence[float], fit_ms: Sequence[float],
                         title: str | None = None) -> go.Figure:
    """Measured step time vs batch size with a fitted line ``a + b·B`` and the resulting throughput.

    ``title`` defaults to "Measured decode step of the tiny model" (in the reader's language).
    """
    if title is None:
        title = tr("Measured decode step of the tiny model")
    b = np.asarray(batches, dtype=float)
    m = np.asarray(measured_ms, dtype=float)
    fig = make_subplots(rows=1, cols=2, subplot_titles=(tr("step time (ms)"), tr("throughput (tokens/s)")),
                        horizontal_spacing=0.12)
    fig.add_trace(go.Scatter(x=b, y=m, mode="markers", marker={"size": 11}, name=tr("measured")), row=1, col=1)
    fig.add_trace(go.Scatter(x=b, y=list(fit_ms), mode="lines", line={"dash": "dash", "width": 3},
                             name=tr("fit a + b·B")), row=1, col=1)
    fig.add_trace(go.Scatter(x=b, y=1000 * b / m, mode="lines+markers", line={"width": 3}, name="B / t",
                             showlegend=False), row=1, col=2)
    for c in (1, 2):
        fig.update_xaxes(title_text=tr("batch size B (requests)"), type="log", tickvals=list(batches), row=1, col=c)
    fig.update_layout(legend={"orientation": "h", "y": -0.25})
    return _layout(fig, title, height=440)


def slot_gantt_figure(panels: Mapping[str, Sequence], batch_size: int, lengths: Mapping[Hashable, int] | None = None,
                      num_steps: Mapping[str, int] | None = None, title: str | None = None,
                      long_threshold: int | None = None) -> go.Figure:
    """A Gantt chart of batch slots for each policy, stacked vertically on a shared step axis.

    Args:
        panels: ``{panel title: segments}``; a segment has ``slot``, ``request_id``, ``start``,
            ``end`` (steps, end exclusive) — :class:`labsupport.sim.batching.SlotSegment` or
            :class:`labsupport.sim.timeline.Segment`.
        batch_size: slots per panel.
        lengths: output length per request (hover text and colour: long requests dark).
        num_steps: per panel, its total steps (grey idle band up to there).
        title: figure title (default: "Slots over time", in the reader's language).
        long_threshold: a request with more tokens than this is drawn dark (default: median).
    """
    if title is None:
        title = tr("Slots over time")
    names = list(panels)
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, subplot_titles=names, vertical_spacing=0.12)
    if lengths and long_threshold is None:
        long_threshold = float(np.median(list(lengths.values())))
    for i, name in enumerate(names, start=1):
        segs = list(panels[name])
        total = (num_steps or {}).get(name, max([s.end for s in segs] + [1]))
        fig.add_trace(go.Bar(y=list(range(batch_size)), x=[total] * batch_size, base=[0] * batch_size,
                             orientation="h", marker_color="#eeeeee", hoverinfo="skip", showlegend=False,
                             width=0.9), row=i, col=1)
        colours, hover = [], []
        for s in segs:
            n = lengths.get(s.request_id) if lengths else None
            dark = n is not None and long_threshold is not None and n > long_threshold
            colours.append("#ff7f0e" if dark else "#1f77b4")
            if n:
                hover.append(tr("request {rid}: steps {first}–{last}, {n} tokens",
                                rid=s.request_id, first=s.start, last=s.end - 1, n=n))
            else:
                hover.append(tr("request {rid}: steps {first}–{last}", rid=s.request_id, first=s.start, last=s.end - 1))
        fig.add_trace(go.Bar(y=[s.slot for s in segs], x=[s.end - s.start for s in segs], base=[s.start for s in segs],
                             orientation="h", marker={"color": colours, "line": {"color": "white", "width": 1}},
                             hovertext=hover, hoverinfo="text", showlegend=False, width=0.9), row=i, col=1)
        fig.update_yaxes(title_text=tr("slot"), autorange="reversed", dtick=1 if batch_size <= 16 else None, row=i, col=1)
    fig.update_xaxes(title_text=tr("step"), row=len(names), col=1)
    fig.update_layout(barmode="overlay", bargap=0.05)
    return _layout(fig, title, height=120 + len(names) * max(180, 22 * batch_size + 80))


def request_timeline_figure(states: Mapping[Hashable, Sequence[str]], preempted: Mapping[Hashable, Sequence[int]] | None = None,
                            title: str | None = None) -> go.Figure:
    """One row per request, one cell per step, coloured by state; ✕ marks a preemption.

    Args:
        states: per request, a state per step from :data:`labsupport.sim.timeline.STATES`.
        preempted: per request, the steps at which it was preempted.
        title: default "Request states per engine step" (in the reader's language).

    Raises:
        TypeError / ValueError: ``states`` empty or not a mapping, a state not in ``STATES``,
            rows of different lengths.
    """
    from ..sim.timeline import STATES

    if title is None:
        title = tr("Request states per engine step")
    checks.mapping("states", states)
    checks.text("title", title)
    widths = {len(row) for row in states.values()}
    if len(widths) > 1:
        raise ValueError(f"states must give every request a state per step (rows of one length), got lengths {sorted(widths)}")
    for r, row in states.items():
        for k, s in enumerate(row):
            if s not in STATES:
                raise ValueError(f"states[{r!r}][{k}] must be one of {list(STATES)}, got {s!r}")
    if preempted is not None:
        checks.mapping("preempted", preempted, allow_empty=True)

    ids = list(states)
    code = {s: i for i, s in enumerate(STATES)}
    z = np.array([[code[s] for s in states[r]] for r in ids], dtype=float)
    n = len(STATES)
    shown = _state_names()
    scale = []
    for i, s in enumerate(STATES):
        scale += [[i / n, STATE_COLOURS[s]], [(i + 1) / n, STATE_COLOURS[s]]]
    fig = go.Figure(go.Heatmap(z=z, y=[str(r) for r in ids], colorscale=scale, zmin=-0.5, zmax=n - 0.5,
                               showscale=False, xgap=1, ygap=2,
                               customdata=np.array([[shown.get(s, s) for s in states[r]] for r in ids], dtype=object),
                               hovertemplate=tr("%{y}, step %{x}: %{customdata}<extra></extra>")))
    for s in STATES[1:]:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=shown.get(s, s),
                                 marker={"symbol": "square", "size": 14, "color": STATE_COLOURS[s],
                                             "line": {"color": "#999999", "width": 1}}))
    if preempted:
        xs = [k for r in ids for k in preempted.get(r, ())]
        ys = [str(r) for r in ids for _ in preempted.get(r, ())]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=tr("preempted"),
                                 marker={"symbol": "x", "size": 14, "color": "black"}))
    fig.update_xaxes(title_text=tr("engine step"))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"})
    fig = _layout(fig, title, height=200 + 34 * len(ids))
    fig.update_layout(margin={"t": 110}, title={"y": 0.97, "yanchor": "top"})
    return fig


def token_latency_figure(panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
                         title: str | None = None) -> go.Figure:
    """Inter-token latency of each request over time, one panel per configuration.

    Args:
        panels: ``{panel title: {request: (times_s, latencies_ms)}}`` — each token's arrival
            time (from the start) and its gap to the previous token.
        title: default "Inter-token latency of the decoding requests" (in the reader's language).
    """
    if title is None:
        title = tr("Inter-token latency of the decoding requests")
    names = list(panels)
    fig = make_subplots(rows=1, cols=len(names), shared_yaxes=True, subplot_titles=names, horizontal_spacing=0.06)
    for c, name in enumerate(names, start=1):
        for k, (rid, (t, ms)) in enumerate(panels[name].items()):
            fig.add_trace(go.Scatter(x=list(t), y=list(ms), mode="lines+markers", name=str(rid), legendgroup=str(rid),
                                     showlegend=c == 1, marker={"size": 5}, line={"color": request_colour(k)}),
                          row=1, col=c)
        fig.update_xaxes(title_text=tr("time (s)"), row=1, col=c)
    fig.update_yaxes(title_text=tr("gap to previous token (ms)"), row=1, col=1)
    return _layout(fig, title, height=440)


def latency_scatter_figure(points: Mapping[str, tuple[Sequence[float], Sequence[float]]], ttft_slo_ms: float,
                           tpot_slo_ms: float, title: str | None = None) -> go.Figure:
    """Each request as a point (TTFT, TPOT) per configuration; the SLO box is shaded.

    Args:
        points: ``{configuration: (ttft_ms per request, tpot_ms per request)}``.
        ttft_slo_ms, tpot_slo_ms: the targets.
        title: default "TTFT and TPOT of every request" (in the reader's language).
    """
    if title is None:
        title = tr("TTFT and TPOT of every request")
    fig = go.Figure()
    xmax = max([max(v[0]) for v in points.values() if len(v[0])] + [ttft_slo_ms]) * 1.1
    ymax = max([max(v[1]) for v in points.values() if len(v[1])] + [tpot_slo_ms]) * 1.1
    fig.add_shape(type="rect", x0=0, y0=0, x1=ttft_slo_ms, y1=tpot_slo_ms, fillcolor="#2ca02c", opacity=0.12,
                  line={"color": "#2ca02c", "dash": "dash"})
    for k, (name, (ttft, tpot)) in enumerate(points.items()):
        fig.add_trace(go.Scatter(x=list(ttft), y=list(tpot), mode="markers", name=name,
                                 marker={"size": 10, "color": request_colour(k)}))
    fig.update_xaxes(title_text="TTFT (ms)", range=[0, xmax])
    fig.update_yaxes(title_text=tr("TPOT (ms per token)"), range=[0, ymax])
    fig.update_layout(legend={"orientation": "h", "y": -0.2})
    return _layout(fig, title, height=480)


def goodput_bars_figure(labels: Sequence[str], throughput: Sequence[float], goodput: Sequence[float],
                        unit: str | None = None, title: str | None = None) -> go.Figure:
    """Grouped bars: throughput and goodput (only requests within the SLO) per configuration.

    ``unit`` (the y axis) defaults to "requests/s", ``title`` to "Throughput vs goodput" (both in the
    reader's language).

    Raises:
        TypeError / ValueError: a value not finite or negative, columns of different lengths.
    """
    if unit is None:
        unit = tr("requests/s")
    if title is None:
        title = tr("Throughput vs goodput")
    checks.text("unit", unit)
    checks.text("title", title)
    labels = [str(x) for x in labels]
    throughput = checks.series("throughput", throughput, low=0, length=len(labels), length_of="labels")
    goodput = checks.series("goodput", goodput, low=0, length=len(labels), length_of="labels")
    fig = go.Figure()
    def short(v: float) -> str:                    # two bars side by side: a label as narrow as its bar
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}"

    fig.add_trace(go.Bar(x=list(labels), y=list(throughput), name=tr("throughput"), marker_color="#7f7f7f",
                         text=[short(v) for v in throughput], textposition="outside", textfont={"size": 12}))
    fig.add_trace(go.Bar(x=list(labels), y=list(goodput), name=tr("goodput (within SLO)"), marker_color="#2ca02c",
                         text=[short(v) for v in goodput], textposition="outside", textfont={"size": 12}))
    fig.update_layout(barmode="group", yaxis_title=unit, yaxis_range=[0, max(list(throughput) + [1e-9]) * 1.25],
                      legend={"orientation": "h", "y": -0.3, "yanchor": "top"}, xaxis={"automargin": True,
                                                                                     "tickangle": 0})
    return _layout(fig, title, height=480)


def _short(v: float) -> str:
    return f"{v:.1f}" if v < 10 else f"{v:.0f}"


def latency_summary_figure(rows: Mapping[str, Mapping[str, float]], title: str, log_y: bool = True) -> go.Figure:
    """Grouped bars of latency statistics (ms) per configuration (log scale: TTFT and TPOT differ 100×).

    Args:
        rows: ``{configuration: {statistic name: value in ms}}``, the same statistics for all.
        title: figure title.
        log_y: logarithmic y axis.

    Raises:
        TypeError / ValueError: ``rows`` empty, configurations with different statistics, a
            value that is NaN, infinite or negative (or not > 0 on a log axis).
    """
    checks.mapping("rows", rows)
    checks.text("title", title)
    check_bool("log_y", log_y)
    names = list(rows)
    stats = list(checks.mapping(f"rows[{names[0]!r}]", rows[names[0]]))
    for name in names:
        checks.mapping(f"rows[{name!r}]", rows[name])
        if list(rows[name]) != stats:
            raise ValueError(f"rows must give every configuration the same statistics {stats}, "
                             f"got {list(rows[name])} for {name!r}")
        vals = checks.series(f"rows[{name!r}]", [rows[name][s] for s in stats], low=0)
        if log_y and min(vals) <= 0:
            raise ValueError(f"rows[{name!r}] must be > 0 on a log axis (log_y=True), got {min(vals)}")
    shown = {"max ITL": tr("max ITL")}                      # the statistics of labsupport.sim.serving.latency_stats
    fig = go.Figure()
    for k, name in enumerate(names):
        vals = [rows[name][s] for s in stats]
        fig.add_trace(go.Bar(x=[shown.get(s, s) for s in stats], y=vals, name=name, marker_color=request_colour(k),
                             text=[_short(v) for v in vals], textposition="outside"))
    fig.update_layout(barmode="group", yaxis_title=tr("ms (log scale)") if log_y else "ms")
    if log_y:
        ticks = [m * 10 ** e for e in range(-1, 6) for m in (1, 2, 5)]
        fig.update_yaxes(type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    return _layout(fig, title, height=440)
