"""Figures for the chapter on serving around the KV cache: latency bars, tier hits, the CacheBlend
error curve, routing, the serving stack and the trade-off table. Pure functions ``data → go.Figure``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..i18n import tr
from ..validation import check_int
from . import checks
from .style import style

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728", "#8c564b")


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    return style(fig, title, height, annotation_size=16)


def latency_bars_figure(rows: Mapping[str, Mapping[str, float]], title: str | None = None) -> go.Figure:
    """Grouped bars: for each setup (``rows`` key) its ``ttft_p50/p95`` and ``itl_p50/p95`` in ms,
    TTFT on the left panel, ITL on the right (their scales differ). ``title`` defaults to
    "TTFT and ITL (ms)" (in the reader's language).

    Raises:
        TypeError / ValueError: ``rows`` empty, a setup without the four statistics, or a value
            that is not a finite number >= 0.
    """
    if title is None:
        title = tr("TTFT and ITL (ms)")
    checks.mapping("rows", rows)
    checks.text("title", title)
    keys = ("ttft_p50", "ttft_p95", "itl_p50", "itl_p95")
    for name, row in rows.items():
        checks.mapping(f"rows[{name!r}]", row)
        missing = [k for k in keys if k not in row]
        if missing:
            raise ValueError(f"rows[{name!r}] must hold {list(keys)}, missing {missing}")
        checks.series(f"rows[{name!r}]", [row[k] for k in keys], low=0)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT (ms)", "ITL (ms)"))
    for k, (name, row) in enumerate(rows.items()):
        for col, metric in ((1, "ttft"), (2, "itl")):
            ys = [row[f"{metric}_p50"], row[f"{metric}_p95"]]
            fig.add_trace(go.Bar(x=["p50", "p95"], y=ys, name=name, marker_color=COLOURS[k % len(COLOURS)],
                                 text=[f"{v:.0f}" for v in ys], textposition="outside", showlegend=col == 1,
                                 legendgroup=name), row=1, col=col)
    fig.update_layout(barmode="group")
    return _layout(fig, title, 420)


def tier_figure(hits: Mapping[str, int], ttft_ms: Mapping[str, float], counts: Mapping[str, int] | None = None,
                title: str | None = None) -> go.Figure:
    """Left: prefix blocks served by each tier (``pool``, ``cpu``, ``disk``, ``miss``). Right: median
    TTFT (ms) of the requests by the slowest tier they needed (``counts`` = requests, for labels).
    ``title`` defaults to "KV tiers: who served the prefix blocks, and what it cost" (in the reader's language)."""
    if title is None:
        title = tr("KV tiers: who served the prefix blocks, and what it cost")
    shown = {"pool": tr("pool"), "cpu": tr("cpu"), "disk": tr("disk"), "miss": tr("miss")}
    fig = make_subplots(rows=1, cols=2, subplot_titles=(tr("blocks served by"), tr("median TTFT by slowest tier (ms)")))
    names = list(hits)
    fig.add_trace(go.Bar(x=[shown.get(n, n) for n in names], y=[hits[n] for n in names], marker_color=COLOURS[0], showlegend=False,
                         text=[str(hits[n]) for n in names], textposition="outside"), row=1, col=1)
    tiers = [n for n in ttft_ms if ttft_ms[n] == ttft_ms[n]]                 # skip NaN (no request)
    labels = [f"{shown.get(n, n)} ({counts[n]})" if counts else shown.get(n, n) for n in tiers]
    fig.add_trace(go.Bar(x=labels, y=[ttft_ms[n] for n in tiers], marker_color=COLOURS[1], showlegend=False,
                         text=[f"{ttft_ms[n]:.1f}" for n in tiers], textposition="outside"), row=1, col=2)
    return _layout(fig, title, 400)


def blend_curve_figure(curves: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
                       marker_r: float | None = None,
                       title: str | None = None) -> go.Figure:
    """``curves[name] = (r values, KL, top-1 agreement)``: KL (log scale) left, top-1 right; a
    dashed line at ``marker_r`` (the panel's slider). ``title`` defaults to "CacheBlend: error vs
    fraction recomputed" (in the reader's language)."""
    if title is None:
        title = tr("CacheBlend: error vs fraction recomputed")
    fig = make_subplots(rows=1, cols=2, subplot_titles=(tr("KL(full ‖ blend) per answer token (nats)"),
                                                        tr("top-1 agreement with the full prefill")))
    for k, (name, (rs, kl, top1)) in enumerate(curves.items()):
        colour = COLOURS[k % len(COLOURS)]
        x = [100 * r for r in rs]
        fig.add_trace(go.Scatter(x=x, y=[max(v, 1e-6) for v in kl], mode="lines+markers", name=name,
                                 line={"color": colour, "width": 3}, legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=list(top1), mode="lines+markers", name=name, showlegend=False,
                                 line={"color": colour, "width": 3}, legendgroup=name), row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], row=1, col=2)
    fig.update_xaxes(title_text=tr("r = tokens recomputed (%)"))
    if marker_r is not None:
        for col in (1, 2):
            fig.add_vline(x=100 * marker_r, line_dash="dash", line_color="grey", row=1, col=col)
    return _layout(fig, title, 420)


def routing_figure(stats: Mapping[str, Mapping[str, float]], title: str | None = None) -> go.Figure:
    """``stats[policy] = {"hit_rate": .., "ttft_p50_ms": .., "tokens_computed": ..}``: three bar panels.
    ``title`` defaults to "Routing over two replicas" (in the reader's language)."""
    if title is None:
        title = tr("Routing over two replicas")
    panels = (("hit_rate", tr("prefix hit rate"), "{:.0%}"), ("ttft_p50_ms", tr("median TTFT (ms)"), "{:.0f}"),
              ("tokens_computed", tr("prompt tokens computed"), "{:,.0f}"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[p[1] for p in panels])
    names = list(stats)
    for col, (key, _, fmt) in enumerate(panels, start=1):
        ys = [stats[n][key] for n in names]
        fig.add_trace(go.Bar(x=names, y=ys, marker_color=[COLOURS[i] for i in range(len(names))], showlegend=False,
                             text=[fmt.format(v) for v in ys], textposition="outside"), row=1, col=col)
    return _layout(fig, title, 380)


#: The layers of a serving stack, bottom first, and where this course's chapters sit in them.
STACK = (
    ("kernels and model execution", "attention and GEMM kernels; one model over many GPUs",
     ["KV cache (03)", "paged attention (04)", "tensor / pipeline / expert parallelism (09)"]),
    ("engine", "one model replica: batching, scheduling, decoding",
     ["sampling (01)", "beam search (02)", "continuous batching, chunked prefill (05)",
      "speculative decoding (06, 07)", "structured output (08)"]),
    ("KV cache manager", "blocks, prefix cache, tiers, moving KV",
     ["block tables, prefix caching (04)", "KV tiers CPU/disk (10)", "context caching (10)", "CacheBlend (10)"]),
    ("routing and orchestration", "many replicas and instances",
     ["prefill/decode disaggregation (10)", "prefix-affinity routing (10)"]),
)


def _stack_words() -> dict[str, str]:
    """The texts of :data:`STACK` in the reader's language (a text not here is shown as given)."""
    return {
        "kernels and model execution": tr("kernels and model execution"),
        "attention and GEMM kernels; one model over many GPUs": tr("attention and GEMM kernels; one model over many GPUs"),
        "KV cache (03)": tr("KV cache (03)"),
        "paged attention (04)": tr("paged attention (04)"),
        "tensor / pipeline / expert parallelism (09)": tr("tensor / pipeline / expert parallelism (09)"),
        "engine": tr("engine"),
        "one model replica: batching, scheduling, decoding": tr("one model replica: batching, scheduling, decoding"),
        "sampling (01)": tr("sampling (01)"),
        "beam search (02)": tr("beam search (02)"),
        "continuous batching, chunked prefill (05)": tr("continuous batching, chunked prefill (05)"),
        "speculative decoding (06, 07)": tr("speculative decoding (06, 07)"),
        "structured output (08)": tr("structured output (08)"),
        "KV cache manager": tr("KV cache manager"),
        "blocks, prefix cache, tiers, moving KV": tr("blocks, prefix cache, tiers, moving KV"),
        "block tables, prefix caching (04)": tr("block tables, prefix caching (04)"),
        "KV tiers CPU/disk (10)": tr("KV tiers CPU/disk (10)"),
        "context caching (10)": tr("context caching (10)"),
        "routing and orchestration": tr("routing and orchestration"),
        "many replicas and instances": tr("many replicas and instances"),
        "prefill/decode disaggregation (10)": tr("prefill/decode disaggregation (10)"),
        "prefix-affinity routing (10)": tr("prefix-affinity routing (10)"),
    }


def serving_stack_figure(stack: Sequence[tuple[str, str, Sequence[str]]] = STACK, per_line: int = 2,
                         title: str | None = None) -> go.Figure:
    """Stacked layers (bottom = kernels) as boxes, each listing its techniques (``per_line`` a line).

    The texts of :data:`STACK` are shown in the reader's language; ``title`` defaults to "The serving
    stack: where each technique lives" (in the reader's language too).

    Raises:
        TypeError / ValueError: ``per_line`` not an integer >= 1, ``title`` not a str.
    """
    if title is None:
        title = tr("The serving stack: where each technique lives")
    check_int("per_line", per_line, 1)
    checks.text("title", title)
    words = _stack_words()
    fig = go.Figure()
    for i, (name, what, items) in enumerate(stack):
        name, what, items = words.get(name, name), words.get(what, what), [words.get(t, t) for t in items]
        y0, y1 = i * 1.1, i * 1.1 + 1.0
        fig.add_shape(type="rect", x0=0, x1=10, y0=y0, y1=y1, line={"color": COLOURS[i % len(COLOURS)], "width": 3},
                      fillcolor=COLOURS[i % len(COLOURS)], opacity=0.15)
        fig.add_annotation(x=0.15, y=(y0 + y1) / 2, xanchor="left", showarrow=False,
                           text=f"<b>{name}</b><br><span style='font-size:12px'>{what}</span>", align="left")
        lines = [" · ".join(items[k:k + per_line]) for k in range(0, len(items), per_line)]
        fig.add_annotation(x=4.0, y=(y0 + y1) / 2, xanchor="left", showarrow=False, text="<br>".join(lines),
                           font={"size": 13}, align="left")
    fig.update_xaxes(visible=False, range=[0, 10])
    fig.update_yaxes(visible=False, range=[-0.1, len(stack) * 1.1])
    return _layout(fig, title, 520)


def tradeoff_table_figure(rows: Sequence[Sequence[str]],
                          header: Sequence[str] | None = None, title: str | None = None) -> go.Figure:
    """A plotly table of strings, one row per technique.

    ``header`` defaults to ("technique", "what it improves", "what it costs", "when not to use it",
    "measured here") and ``title`` to "Trade-offs", both in the reader's language.

    Raises:
        TypeError: ``title`` not a str.
        ValueError: a row with another number of cells than ``header``.
    """
    if header is None:
        header = (tr("technique"), tr("what it improves"), tr("what it costs"), tr("when not to use it"),
                  tr("measured here"))
    if title is None:
        title = tr("Trade-offs")
    checks.text("title", title)
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(f"rows[{i}] must have one cell per header column ({len(header)}), got {len(row)}")
    cols = list(zip(*rows)) if rows else [[] for _ in header]
    fig = go.Figure(go.Table(header={"values": [f"<b>{h}</b>" for h in header], "align": "left",
                                     "font": {"size": 14}, "fill_color": "#e8eef7"},
                             cells={"values": [list(c) for c in cols], "align": "left", "font": {"size": 13},
                                    "height": 30}))
    return _layout(fig, title, 160 + 95 * max(1, len(rows)))
