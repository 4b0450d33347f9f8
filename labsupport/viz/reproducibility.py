"""Figures of the reproducibility chapter: a sum's error in two orders against its bound, one request's
logit change in a batch, and how many completions one prompt gets over many batch mixes.

Pure functions ``data → go.Figure``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from ..i18n import tr
from .style import LEGEND_BOTTOM, LEGEND_TOP, style

DTYPE_COLORS = {"float32": "#1f77b4", "bfloat16": "#d62728", "float16": "#2ca02c"}
FLOOR = 1e-9
"""Where a difference of exactly 0 is drawn on a log axis (and labelled "0: identical")."""


def summation_figure(errors: Sequence) -> go.Figure:
    """Median relative error of sums of n numbers (log–log) per format: sequential (solid) and pairwise
    (dashed) order, with each order's worst-case bound (dotted, thin).

    Args:
        errors: :class:`~labsupport.reproducibility.SumError` rows.

    Raises:
        ValueError: no rows.
    """
    if not errors:
        raise ValueError("errors must hold at least one SumError")
    fig = go.Figure()
    names = {"sequential": tr("sequential"), "pairwise": tr("pairwise")}
    for dtype in dict.fromkeys(e.dtype for e in errors):
        rows = [e for e in errors if e.dtype == dtype]
        n = [e.length for e in rows]
        color = DTYPE_COLORS.get(dtype, "#7f7f7f")
        for order, dash in (("sequential", "solid"), ("pairwise", "dash")):
            fig.add_trace(go.Scatter(x=n, y=[max(getattr(e, order), FLOOR) for e in rows], mode="lines+markers",
                                     name=f"{dtype} · {names[order]}", line={"color": color, "dash": dash}))
            fig.add_trace(go.Scatter(x=n, y=[getattr(e, f"bound_{order}") for e in rows], mode="lines",
                                     name=f"{dtype} · {tr('bound')} ({names[order]})", showlegend=False,
                                     line={"color": color, "dash": "dot", "width": 1}))
    fig.update_xaxes(type="log", title=tr("numbers summed (n)"))
    fig.update_yaxes(type="log", title=tr("relative error |sum − exact| / Σ|x| (median)"))
    return style(fig, tr("One sum, two orders: measured error (lines) and the worst-case bound (dotted)"), 560,
                 bottom=150, legend=LEGEND_BOTTOM)


def batch_variance_figure(results: Mapping[str, Sequence]) -> go.Figure:
    """Largest |Δ logit| of one request in a batch against alone, per batch size (log y), one bar
    group per setting; a bit-identical result is drawn at the floor and marked "0".

    Args:
        results: ``{setting label: [BatchVariance, …]}``.

    Raises:
        ValueError: no settings.
    """
    if not results:
        raise ValueError("results must map at least one setting to its BatchVariance rows")
    fig = go.Figure()
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#7f7f7f"]
    for i, (label, rows) in enumerate(results.items()):
        diffs = [max(r.prefill_diff, r.decode_diff) for r in rows]
        fig.add_trace(go.Bar(x=[str(r.batch_size) for r in rows], y=[max(d, FLOOR) for d in diffs], name=label,
                             marker_color=palette[i % len(palette)],
                             text=["0" if d == 0 else "" for d in diffs], textposition="outside",
                             hovertemplate="B=%{x}: %{y:.2e}<extra>" + label + "</extra>"))
    top = max((max(r.prefill_diff, r.decode_diff) for rows in results.values() for r in rows), default=0)
    fig.update_yaxes(type="log", title=tr("largest |Δ logit| vs alone (log; 0 = bit-identical)"),
                     range=[math.log10(FLOOR) - 0.5, max(0.0, math.log10(max(top, FLOOR)) + 0.5)])
    fig.update_xaxes(title=tr("requests in the batch"), type="category")
    return style(fig, tr("One request's logits in a batch against the same request alone"), 460, legend=LEGEND_TOP)


def completions_figure(results: Mapping[str, object]) -> go.Figure:
    """How many batch mixes gave each distinct completion of one prompt, one stacked bar per setting.

    Args:
        results: ``{setting label: MixResult}``.

    Raises:
        ValueError: no settings.
    """
    if not results:
        raise ValueError("results must map at least one setting to its MixResult")
    fig = go.Figure()
    most = max(r.distinct for r in results.values())
    for k in range(most):
        counts = [r.counts[k][1] if k < r.distinct else 0 for r in results.values()]
        fig.add_trace(go.Bar(x=list(results), y=counts, name=tr("completion {k}", k=k + 1),
                             hovertemplate="%{x}: %{y}<extra></extra>"))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title=tr("batch mixes"))
    return style(fig, tr("Distinct completions of one prompt over the same batch mixes"), 420, legend=LEGEND_TOP)
