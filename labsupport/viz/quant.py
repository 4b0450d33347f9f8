"""Figures of the quantisation chapter: error per format and scale granularity, the real model's
activation outliers, per-matrix error of one setting, and KV capacity under a memory budget.

Pure functions ``data → go.Figure``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
import torch

from ..i18n import tr
from .style import LEGEND_TOP, style

COLORS = {"tensor": "#d62728", "channel": "#ff7f0e", "group": "#1f77b4", "none": "#7f7f7f"}
TARGET_COLORS = {"attn": "#1f77b4", "mlp": "#2ca02c", "lm_head": "#9467bd"}


def format_error_figure(errors: Mapping[str, Mapping[str, float]]) -> go.Figure:
    """Relative error ``‖W − Ŵ‖/‖W‖`` of one weight matrix per format (x) and granularity (bars), log scale.

    Args:
        errors: ``{granularity label: {format: error}}`` (e.g. ``"per tensor"``, ``"per group of 32"``).

    Raises:
        ValueError: no data.
    """
    if not isinstance(errors, Mapping) or not errors or not all(isinstance(v, Mapping) for v in errors.values()):
        raise ValueError("errors must be a non-empty {granularity: {format: error}} mapping")
    fig = go.Figure()
    palette = ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#7f7f7f"]
    for i, (label, per_format) in enumerate(errors.items()):
        fig.add_trace(go.Bar(x=list(per_format), y=[max(v, 1e-9) for v in per_format.values()], name=label,
                             marker_color=palette[i % len(palette)],
                             hovertemplate="%{x}: %{y:.2e}<extra>" + label + "</extra>"))
    fig.update_yaxes(type="log", title=tr("relative error (log)"))
    fig.update_xaxes(title=tr("format"))
    return style(fig, tr("Rounding error of one real weight matrix, per format and scale granularity"), 460,
                 legend=LEGEND_TOP)


def outlier_figure(absmax: torch.Tensor, name: str) -> go.Figure:
    """Largest |activation| of every hidden channel of one layer's input, sorted: a few channels
    dwarf the rest (the outliers that break per-tensor int8 activations).

    Args:
        absmax: ``(channels,)`` max |x| per channel over the calibration tokens.
        name: the layer, for the title.
    """
    if not isinstance(absmax, torch.Tensor) or absmax.dim() != 1 or absmax.numel() == 0:
        raise ValueError(f"absmax must be a non-empty 1-D tensor, got {getattr(absmax, 'shape', absmax)!r}")
    values = absmax.float().sort(descending=True).values.tolist()
    median = sorted(values)[len(values) // 2]
    ratio = f"{values[0] / median:.0f}×" if median > 0 else "∞×"
    fig = go.Figure(go.Bar(x=list(range(len(values))), y=values, marker_color="#1f77b4", name="max |x|"))
    fig.add_hline(y=median, line_dash="dot", line_color="#d62728",
                  annotation_text=tr("median channel {median:.2f}", median=median), annotation_position="top right")
    fig.update_xaxes(title=tr("hidden channel (sorted by max |x|)"))
    fig.update_yaxes(title=tr("max |activation|"))
    return style(fig, tr("Input of {name}: top channel {top:.1f} = {ratio} the median", name=name, top=values[0],
                         ratio=ratio), 420)


def matrix_error_figure(errors: Mapping[str, float], title: str) -> go.Figure:
    """Relative error of every quantised matrix of the model (one bar each, coloured by kind)."""
    if not isinstance(errors, Mapping) or not errors:
        raise ValueError("errors must be a non-empty {matrix name: error} mapping")
    names = list(errors)
    kinds = ["lm_head" if n == "lm_head" else ("attn" if ".attn." in n else "mlp") for n in names]
    fig = go.Figure()
    for kind in TARGET_COLORS:
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if idx:
            fig.add_trace(go.Bar(x=[names[i] for i in idx], y=[errors[names[i]] for i in idx], name=kind,
                                 marker_color=TARGET_COLORS[kind]))
    fig.update_yaxes(title="‖W − Ŵ‖ / ‖W‖", rangemode="tozero")
    fig.update_xaxes(tickangle=-40)
    return style(fig, title, 440, bottom=130, legend=LEGEND_TOP)


def kv_capacity_figure(dtypes: Sequence[str], tokens: Sequence[int], drift: Sequence[float]) -> go.Figure:
    """Tokens of KV that fit one memory budget per ``kv_cache_dtype`` (bars), with the logit drift
    against fp32 KV (max |Δ logit| over a window) written on each bar."""
    if not dtypes or not (len(dtypes) == len(tokens) == len(drift)):
        raise ValueError(f"dtypes, tokens and drift must be non-empty and of one length, got {len(dtypes)}, "
                         f"{len(tokens)}, {len(drift)}")
    fig = go.Figure(go.Bar(x=list(dtypes), y=list(tokens), marker_color=["#7f7f7f"] + ["#1f77b4"] * (len(dtypes) - 1),
                           text=[tr("{tokens:,} tokens<br>max |Δ logit| {drift:.2g}", tokens=t, drift=d) for t, d in zip(tokens, drift)],
                           textposition="outside"))
    fig.update_yaxes(title=tr("tokens that fit"), range=[0, max(max(tokens), 1) * 1.3])
    fig.update_xaxes(title="kv_cache_dtype")
    words = {2: tr("two"), 3: tr("three"), 4: tr("four")}
    return style(fig, tr("One KV memory budget, {n} ways to store it", n=words.get(len(dtypes), len(dtypes))), 420)
