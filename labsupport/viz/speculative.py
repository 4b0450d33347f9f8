"""Figures of chapter 06 (speculative decoding).

Pure functions: numbers and strings in, a ``plotly.graph_objects.Figure`` out; nothing here
runs a model or imports widgets. Every figure has a fixed set of traces so that a panel can
wrap it in a ``go.FigureWidget`` and update the data in place.

Colours: green = accepted draft token, red = rejected and
replaced by the target's own token, purple = bonus token after full acceptance, grey =
drafted but discarded (after the first rejection).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from ..i18n import tr
from ..validation import check_int
from . import checks
from .style import FONT_SIZE, LEGEND_BOTTOM, style

ACCEPTED = "#2ca02c"
REPLACED = "#d62728"
BONUS = "#9467bd"
DISCARDED = "#c7c7c7"
THEORY = "#1f77b4"
MEASURED = "#ff7f0e"


def _style(fig: go.Figure, title: str, height: int) -> go.Figure:
    """The course style with the legend at the bottom (room for it below the axes)."""
    return style(fig, title, height + 70, left=10, top=60, bottom=140, legend=LEGEND_BOTTOM)


def round_cells(draft_labels: Sequence[str], num_accepted: int, next_label: str) -> list[tuple[str, str]]:
    """The cells of one round, left to right, as ``(label, status)``.

    Status is ``"accepted"``, ``"discarded"``, ``"replaced"`` or ``"bonus"``: the accepted
    prefix, then the target's own token (bonus when all k ≥ 1 drafts were accepted, else the
    replacement of the first rejected draft — or a plain decode token when nothing was
    drafted), then the discarded drafts from the first rejected one on.

    Raises:
        ValueError: ``num_accepted`` outside ``0..len(draft_labels)``.
    """
    k = len(draft_labels)
    if not 0 <= num_accepted <= k:
        raise ValueError(f"num_accepted must be in [0, {k}], got {num_accepted}")
    cells = [(lab, "accepted") for lab in draft_labels[:num_accepted]]
    if num_accepted == k > 0:
        return cells + [(next_label, "bonus")]
    cells.append((next_label, "replaced"))
    return cells + [(lab, "discarded") for lab in draft_labels[num_accepted:]]


def rounds_figure(rounds: Sequence, label: Callable[[int], str] | None = None, *,
                  title: str | None = None, max_rounds: int = 12) -> go.Figure:
    """Speculative rounds: one row per round, one cell per token.

    Args:
        rounds: objects with ``draft_tokens``, ``num_accepted``, ``next_token`` (e.g.
            :class:`labsupport.speculative.RoundRecord`); at most ``max_rounds`` are drawn.
        label: token id → display string (default: the id itself); shown without its leading
            or trailing spaces and cut to 7 characters (the hover shows the full token).
        title: figure title (default "Draft-verify rounds").

    Returns:
        A figure with four scatter traces (accepted, replaced, bonus, discarded) of square
        markers with the token text on them (``customdata``: the full token); rows top to
        bottom = rounds in order; a colour key is written above the rounds.
    """
    base = label or str
    title = tr("Draft-verify rounds") if title is None else title

    def short(t: int) -> str:                     # keep a token inside its square
        text = base(t).strip() or repr(base(t))
        return text if len(text) <= 7 else text[:6] + "…"

    rows = list(rounds)[:max_rounds]
    pts = {s: ([], [], []) for s in ("accepted", "replaced", "bonus", "discarded")}
    fulls: dict[str, list[str]] = {}
    for r, rec in enumerate(rows):
        drafts = [int(t) for t in rec.draft_tokens]
        cells = round_cells([short(t) for t in drafts], int(rec.num_accepted), short(int(rec.next_token)))
        full = [repr(base(t)) for t in drafts[:int(rec.num_accepted)]] + [repr(base(int(rec.next_token)))] \
            + [repr(base(t)) for t in drafts[int(rec.num_accepted):]]
        for x, ((lab, status), whole) in enumerate(zip(cells, full)):
            pts[status][0].append(x)
            pts[status][1].append(r)
            pts[status][2].append(lab)
            fulls.setdefault(status, []).append(whole)
    fig = go.Figure()
    names = {"accepted": tr("accepted draft"), "replaced": tr("the target's token (replaces the first rejected draft)"),
             "bonus": tr("bonus token (all drafts accepted)"), "discarded": tr("rejected or discarded draft (from the first rejection on)")}
    colors = {"accepted": ACCEPTED, "replaced": REPLACED, "bonus": BONUS, "discarded": DISCARDED}
    for status, (xs, ys, labs) in pts.items():
        fig.add_trace(go.Scatter(x=xs, y=ys, text=labs, customdata=fulls.get(status, []), mode="markers+text",
                                 name=names[status], showlegend=False,
                                 marker={"symbol": "square", "size": 62, "color": colors[status]},
                                 textfont={"size": FONT_SIZE - 2, "color": "black"},
                                 hovertemplate="%{customdata}<extra>" + names[status] + "</extra>"))
    key = "<br>".join("   ".join(f"<span style='color:{colors[s]}'>■</span> {names[s]}" for s in pair)
                      for pair in (("accepted", "replaced"), ("bonus", "discarded")))
    fig.add_annotation(text=key, xref="paper", yref="paper", x=0, y=1, xanchor="left", yanchor="bottom",
                       yshift=10, showarrow=False, align="left", font={"size": FONT_SIZE - 2})
    n = max(len(rows), 1)
    fig.update_yaxes(range=[n - 0.5, -0.5], tickvals=list(range(n)), ticktext=[tr("round {n}", n=i + 1) for i in range(n)],
                     showgrid=False, zeroline=False)
    width = max((len(r.draft_tokens) + 1 for r in rows), default=2)    # γ + 1 cells at most
    fig.update_xaxes(title=tr("token of the round (emitted, then discarded)"), range=[-0.6, width - 0.4],
                     dtick=1, showgrid=False, zeroline=False)
    fig = _style(fig, title, 140 + 68 * n)
    fig.update_layout(margin={"t": 130, "b": 60}, height=190 + 76 * n)   # colour key above; 76 px per round
    return fig


def speedup_curve_figure(gammas: Sequence[int], tokens_per_round: Sequence[float], speedup: Sequence[float],
                         mc_speedup: Sequence[float] | None = None, *, best: tuple[int, float] | None = None,
                         selected: int | None = None, title: str | None = None) -> go.Figure:
    """Theory curve (line), Monte Carlo points, best γ (star) and the selected γ (dashed line).

    Args:
        gammas: draft lengths (x).
        tokens_per_round: ``(1−α^(γ+1))/(1−α)`` per γ (the no-cost ceiling, dotted).
        speedup: ``E[tokens]/(γc + v)`` per γ (solid).
        mc_speedup: the same from simulated rounds (markers), optional.
        best: ``(γ*, speed-up)`` to mark.
        selected: a γ to mark with a vertical line.
        title: figure title (default "Speed-up vs draft length γ").

    Returns:
        Figure with traces: tokens per round, speed-up (theory), Monte Carlo, best γ.

    Raises:
        TypeError / ValueError: columns not finite, of other lengths, or a γ not an integer.
    """
    gammas = [check_int("gammas[i]", g, 0) for g in gammas]
    tokens_per_round = checks.series("tokens_per_round", tokens_per_round, low=0, length=len(gammas), length_of="gammas")
    speedup = checks.series("speedup", speedup, low=0, length=len(gammas), length_of="gammas")
    if mc_speedup is not None:
        mc_speedup = checks.series("mc_speedup", mc_speedup, low=0, length=len(gammas), length_of="gammas")
    if selected is not None:
        check_int("selected", selected, 0)
    title = tr("Speed-up vs draft length γ") if title is None else checks.text("title", title)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(gammas), y=list(tokens_per_round), name=tr("tokens / target forward (c = 0, v = 1)"),
                             mode="lines", line={"color": "#7f7f7f", "dash": "dot", "width": 2}))
    fig.add_trace(go.Scatter(x=list(gammas), y=list(speedup), name=tr("speed-up (theory)"), mode="lines+markers",
                             line={"color": THEORY, "width": 3}))
    fig.add_trace(go.Scatter(x=list(gammas), y=list(mc_speedup) if mc_speedup is not None else [],
                             name=tr("speed-up (Monte Carlo)"), mode="markers",
                             marker={"color": MEASURED, "size": 11, "symbol": "circle-open", "line": {"width": 3}}))
    fig.add_trace(go.Scatter(x=[best[0]] if best else [], y=[best[1]] if best else [], name=tr("best γ"),
                             mode="markers+text",
                             text=([tr("best γ ≥ {gamma} (edge of the range): {speedup:.2f}×", gamma=best[0], speedup=best[1])
                                    if best[0] == max(gammas)
                                    else tr("best γ = {gamma}: {speedup:.2f}×", gamma=best[0], speedup=best[1])]
                                   if best else []),
                             textposition="top left" if best and best[0] > (min(gammas) + max(gammas)) / 2 else "top right",
                             marker={"symbol": "star", "size": 20, "color": "#e377c2"}))
    fig.add_hline(y=1.0, line={"color": "black", "width": 1, "dash": "dash"})
    if selected is not None:
        fig.add_vline(x=selected, line={"color": "#555", "width": 1, "dash": "dash"})
    fig.update_xaxes(title=tr("draft length γ (tokens)"), dtick=1)
    fig.update_yaxes(title=tr("× plain decoding"), rangemode="tozero")
    return _style(fig, title, 460)


def tokens_per_forward_heatmap(alphas: Sequence[float], gammas: Sequence[int], table: Sequence[Sequence[float]], *,
                               title: str | None = None) -> go.Figure:
    """Tokens per target forward as a heatmap with the numbers written in: rows α, columns γ
    (default title "Tokens per target forward (1−α^(γ+1))/(1−α)").

    Raises:
        ValueError: ``table`` is not ``len(alphas) × len(gammas)``.
    """
    title = tr("Tokens per target forward (1−α^(γ+1))/(1−α)") if title is None else title
    z = np.asarray(table, dtype=float)
    if z.shape != (len(alphas), len(gammas)):
        raise ValueError(f"table must be {len(alphas)}×{len(gammas)} (alphas × gammas), got {z.shape}")
    fig = go.Figure(go.Heatmap(z=z, x=[str(g) for g in gammas], y=[f"α = {a:g}" for a in alphas],
                               text=[[f"{v:.2f}" for v in row] for row in z], texttemplate="%{text}",
                               textfont={"size": FONT_SIZE}, colorscale="Blues", showscale=False))
    fig.update_xaxes(title=tr("draft length γ"))
    fig.update_yaxes(autorange="reversed")
    return _style(fig, title, 120 + 50 * len(alphas))


def acceptance_by_position_figure(series: Mapping[str, Sequence[float]], *, theory_alpha: float | None = None,
                                  title: str | None = None) -> go.Figure:
    """Measured P(accept position i | reached i) per series (one bar group per position).

    Args:
        series: name → acceptance per position (NaN where never reached).
        theory_alpha: draws the i.i.d. assumption (flat α) as a dashed line.
        title: figure title (default "Acceptance by draft position").
    """
    title = tr("Acceptance by draft position") if title is None else title
    fig = go.Figure()
    for name, vals in series.items():
        fig.add_trace(go.Bar(x=[i + 1 for i in range(len(vals))], y=[None if np.isnan(v) else v for v in vals],
                             name=name))
    if theory_alpha is not None:
        fig.add_hline(y=theory_alpha, line={"dash": "dash", "color": "black"},
                      annotation_text=tr("overall α = {alpha:.2f}", alpha=theory_alpha), annotation_position="top right")
    fig.update_xaxes(title=tr("draft position i"), dtick=1)
    fig.update_yaxes(title=tr("acceptance rate"), range=[0, 1.05])
    fig.update_layout(barmode="group")
    return _style(fig, title, 420)


def measured_speedup_figure(gammas: Sequence[int], series: Mapping[str, Mapping[str, Sequence[float]]], *,
                            title: str | None = None) -> go.Figure:
    """Wall-clock speed-up vs γ: per series a measured line and its prediction (dashed).

    Args:
        series: name → ``{"measured": [...], "predicted": [...], "free_verification": [...]}``
            (each per γ; ``"predicted"``: with the measured c, v(γ) and the prompt's prefill;
            ``"free_verification"`` = the textbook formula with v = 1, optional).
        title: figure title (default "Measured vs predicted speed-up").
    """
    title = tr("Measured vs predicted speed-up") if title is None else title
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    fig = go.Figure()
    for i, (name, d) in enumerate(series.items()):
        col = palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=list(gammas), y=list(d["measured"]), name=tr("{name}: measured", name=name),
                                 mode="lines+markers", line={"color": col, "width": 3}))
        if "predicted" in d:
            fig.add_trace(go.Scatter(x=list(gammas), y=list(d["predicted"]), name=tr("{name}: predicted (measured c, v, prefill)", name=name),
                                     mode="lines", line={"color": col, "dash": "dash", "width": 2}))
        if "free_verification" in d:
            fig.add_trace(go.Scatter(x=list(gammas), y=list(d["free_verification"]), name=tr("{name}: formula with v=1", name=name),
                                     mode="lines", line={"color": col, "dash": "dot", "width": 1}))
    fig.add_hline(y=1.0, line={"color": "black", "width": 1})
    fig.update_xaxes(title=tr("draft length γ (tokens)"), dtick=1)
    fig.update_yaxes(title=tr("× plain target decoding (wall clock)"), rangemode="tozero")
    _style(fig, title, 480)
    fig.update_layout(height=550 + 26 * len(fig.data), margin={"b": 100 + 26 * len(fig.data)})   # long legend
    return fig


def verify_cost_figure(gammas: Sequence[int], v: Sequence[float], *, c: float | None = None,
                       title: str | None = None) -> go.Figure:
    """Bars of v(γ) (× one decode step) against the textbook assumption v = 1 (dashed); default title
    "Verification cost v(γ): a target forward over γ+1 tokens"."""
    title = tr("Verification cost v(γ): a target forward over γ+1 tokens") if title is None else title
    fig = go.Figure(go.Bar(x=list(gammas), y=list(v), name=tr("measured v(γ)"), marker_color=THEORY,
                           text=[f"{x:.2f}" for x in v], textposition="outside"))
    fig.add_hline(y=1.0, line={"dash": "dash", "color": "black"}, annotation_text=tr("v = 1 (bandwidth-bound GPU)"))
    if c is not None:
        fig.add_hline(y=c, line={"dash": "dot", "color": MEASURED}, annotation_text=tr("draft step c = {c:.2f}", c=c),
                      annotation_position="bottom right")
    fig.update_xaxes(title=tr("draft length γ (the forward covers γ+1 tokens)"), dtick=1)
    fig.update_yaxes(title=tr("time / one target decode step"), rangemode="tozero")
    return _style(fig, title, 420)


def distribution_check_figure(labels: Sequence[str], exact: Sequence[float], series: Mapping[str, Sequence[float]], *,
                              title: str | None = None) -> go.Figure:
    """Exact target probabilities (outlined bars) and empirical frequencies (filled bars); default
    title "Emitted tokens: speculative vs target sampling".

    Raises:
        ValueError: a series' length differs from ``labels``.
    """
    for name, vals in series.items():
        if len(vals) != len(labels):
            raise ValueError(f"series {name!r} must have {len(labels)} values, got {len(vals)}")
    title = tr("Emitted tokens: speculative vs target sampling") if title is None else title
    fig = go.Figure(go.Bar(x=list(labels), y=list(exact), name=tr("exact p (target)"),
                           marker={"color": "rgba(0,0,0,0)", "line": {"color": "black", "width": 2}}))
    for name, vals in series.items():
        fig.add_trace(go.Bar(x=list(labels), y=list(vals), name=name, opacity=0.75))
    fig.update_layout(barmode="group")
    fig.update_xaxes(title=tr("first two tokens"), type="category", tickangle=-45)
    fig.update_yaxes(title=tr("probability / frequency"))
    return _style(fig, title, 460)
