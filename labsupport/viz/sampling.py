"""Figures of chapter 01 (sampling): next-token distributions, filters, temperature, steps.

Pure functions: plain lists of token strings and numbers in, a ``plotly.graph_objects.Figure``
out. Nothing here runs a model or imports widgets; the panels in
``labsupport.widgets.sampling`` compute the numbers with ``labsupport.sampling`` and pass
them in. Every figure has a fixed set of traces, so a panel can wrap it in a
``go.FigureWidget`` and update the traces' data in place.

Token strings are shown as ``LoadedModel.token_str`` renders them (``␣`` = space,
``⏎`` = newline). The token axis is always categorical, so a token such as ``"1"`` stays a
label, and repeated strings get their rank appended so that no two bars merge. Token axes are
numeric positions labelled with ``ticktext`` (:func:`token_axis`), so a live panel can swap in
another prompt's tokens without stale labels.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..i18n import tr
from .style import LEGEND_TOP, style

KEPT_COLOR = "#1f77b4"
CUT_COLOR = "#c7c7c7"
BASE_COLOR = "#d62728"
LOGIT_COLOR = "#7f7f7f"
LOOP_COLOR = "#ff7f0e"


def _check_lengths(**columns: Sequence) -> int:
    """Common length of the named columns; ``ValueError`` naming them when they differ."""
    lengths = {name: len(col) for name, col in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{', '.join(lengths)} must have the same length, got {lengths}")
    return next(iter(lengths.values()))


def unique_labels(tokens: Sequence[str]) -> list[str]:
    """Axis labels for ``tokens``: unchanged, except repeats get ``" #rank"`` (1-based) appended.

    Byte-level BPE tokens that are partial UTF-8 characters all decode to ``"�"``; on a
    categorical axis they would merge into one bar.
    """
    seen: dict[str, int] = {}
    for t in tokens:
        seen[t] = seen.get(t, 0) + 1
    return [t if seen[t] == 1 else f"{t} #{i + 1}" for i, t in enumerate(tokens)]


def token_axis(labels: Sequence[str]) -> dict:
    """Y-axis settings for a token axis: numeric positions ``0..n-1`` labelled with the tokens.

    Not a categorical axis: a ``go.FigureWidget`` whose bars get another prompt's tokens would
    keep the old categories on the axis in the browser (stale labels, unsorted bars). Positions
    with ``ticktext`` replace cleanly, keep a token such as ``"1"`` a label, and put the most
    likely candidate on top (``autorange="reversed"``).
    """
    n = len(labels)
    return {"type": "linear", "tickmode": "array", "tickvals": list(range(n)), "ticktext": list(labels),
            "autorange": "reversed", "range": None, "showgrid": False, "zeroline": False}


def _style(fig: go.Figure, title: str, height: int) -> go.Figure:
    return style(fig, title, height, left=10, legend=LEGEND_TOP)


def distribution_figure(tokens: Sequence[str], logits: Sequence[float], probs: Sequence[float], *,
                        temperature: float | None = None, title: str | None = None) -> go.Figure:
    """Logits (left) and probabilities (right) of the top candidates, most likely on top.

    Temperature and distribution, on real numbers: the left bars
    are the model's logits ``z_i``, the right bars ``p_i = softmax(z / T)_i``. Adding a constant
    to every logit moves the left bars and leaves the right bars where they are.

    Args:
        tokens: display strings of the candidates, most likely first (length n).
        logits: their logits ``z_i`` (n,), unitless model scores.
        probs: their probabilities (n,), in [0, 1], over the *whole* vocabulary.
        temperature: shown in the axis title when given.
        title: figure title.

    Returns:
        A figure with two traces: ``logits`` (subplot 1) and ``probability`` (subplot 2).

    Raises:
        ValueError: the three sequences differ in length.
    """
    n = _check_lengths(tokens=tokens, logits=logits, probs=probs)
    labels = unique_labels(tokens)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        column_widths=[0.4, 0.6])
    pos = list(range(n))
    fig.add_trace(go.Bar(x=list(logits), y=pos, customdata=labels, orientation="h", name=tr("logits"),
                         marker_color=LOGIT_COLOR, hovertemplate="%{customdata}: z = %{x:.3f}<extra></extra>",
                         showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=list(probs), y=pos, customdata=labels, orientation="h", name=tr("probability"),
                         marker_color=KEPT_COLOR, text=[f"{100 * p:.1f} %" for p in probs], textposition="outside",
                         cliponaxis=False, hovertemplate="%{customdata}: p = %{x:.4f}<extra></extra>",
                         showlegend=False), row=1, col=2)
    p_title = tr("probability p") if temperature is None else tr("probability p at T = {t:g}", t=temperature)
    fig.update_xaxes(title_text=tr("logit z (model score)"), row=1, col=1)
    fig.update_xaxes(title_text=p_title, range=[0, 1.15], tickformat=".0%", row=1, col=2)
    fig.update_yaxes(**token_axis(labels))
    fig.update_yaxes(title_text=tr("top {n} next tokens", n=n), row=1, col=1)
    return _style(fig, title or tr("Next-token distribution"), height=max(420, 90 + 26 * n))


def filter_label(reason: str) -> str:
    """A filter's name as a reader sees it: top-k, top-p and min-p are the field's own names in every
    language; greedy is translated (:mod:`labsupport.i18n`)."""
    return tr("greedy") if reason == "greedy" else reason


def filter_figure(tokens: Sequence[str], base_probs: Sequence[float], final_probs: Sequence[float],
                  reasons: Sequence[str], *, title: str | None = None) -> go.Figure:
    """Kept versus cut candidates of one sampling step.

    Args:
        tokens: display strings of the candidates, most likely first (length n).
        base_probs: probabilities after repetition penalty and temperature, before any cut (n,).
        final_probs: probabilities actually sampled from, renormalised over the kept set (n,);
            0 for a cut candidate.
        reasons: ``""`` for a kept candidate, else the filter that cut it (``"top-k"``,
            ``"top-p"``, ``"min-p"``, ``"greedy"``), as ``labsupport.sampling.trace_filters``
            reports it (n,).
        title: figure title.

    Returns:
        A figure with three traces in this order: ``kept`` (bars at the final probability),
        ``cut`` (grey bars at the probability before the cut, labelled with the reason) and
        ``before cut`` (markers at the probability before the cut).

    Raises:
        ValueError: the sequences differ in length.
    """
    _check_lengths(tokens=tokens, base_probs=base_probs, final_probs=final_probs, reasons=reasons)
    labels = unique_labels(tokens)
    kept = [f if r == "" else 0.0 for f, r in zip(final_probs, reasons)]
    cut = [0.0 if r == "" else b for b, r in zip(base_probs, reasons)]
    pos = list(range(len(labels)))
    fig = go.Figure()
    fig.add_trace(go.Bar(x=kept, y=pos, customdata=labels, orientation="h", name=tr("kept: probability sampled from"),
                         marker_color=KEPT_COLOR, text=[f"{100 * p:.1f} %" if p > 0 else "" for p in kept],
                         textposition="outside", cliponaxis=False,
                         hovertemplate=tr("%{customdata}: sampled with p = %{x:.4f}<extra></extra>")))
    fig.add_trace(go.Bar(x=cut, y=pos, customdata=labels, orientation="h", name=tr("cut (reason)"),
                         marker_color=CUT_COLOR, text=[tr("cut by {reason}", reason=filter_label(r)) if r else "" for r in reasons],
                         textposition="outside", cliponaxis=False,
                         hovertemplate=tr("%{customdata}: %{text}, p before = %{x:.4f}<extra></extra>")))
    fig.add_trace(go.Scatter(x=list(base_probs), y=pos, customdata=labels, mode="markers", name=tr("before the cut"),
                             marker={"symbol": "line-ns-open", "size": 14, "color": BASE_COLOR,
                                     "line": {"width": 3, "color": BASE_COLOR}},
                             hovertemplate=tr("%{customdata}: p before the cut = %{x:.4f}<extra></extra>")))
    fig.update_layout(barmode="overlay", bargap=0.25)
    fig.update_xaxes(title_text=tr("probability"), range=[0, 1.2], tickformat=".0%")
    fig.update_yaxes(title_text=tr("next-token candidates"), **token_axis(labels))
    return _style(fig, title or tr("Which candidates survive the filters"), height=max(420, 110 + 26 * len(labels)))


def entropy_curve_figure(temperatures: Sequence[float], entropy_bits: Sequence[float], *,
                         marker_temperature: float | None = None, marker_entropy: float | None = None,
                         title: str | None = None) -> go.Figure:
    """Entropy ``H = -Σ p log₂ p`` (bits) of the next-token distribution as T varies.

    The right axis reads the same curve as perplexity ``2^H`` (effective number of candidates).

    Args:
        temperatures: T values (m,), > 0.
        entropy_bits: entropy at each T (m,), in bits.
        marker_temperature, marker_entropy: one point to highlight (e.g. the slider's T).
        title: figure title.

    Returns:
        A figure with two traces: ``entropy`` (line) and ``current T`` (one marker, or none).

    Raises:
        ValueError: the sequences differ in length, a value is not finite, T not > 0 or H < 0.
        TypeError: a value is not a number.
    """
    from .checks import optional_real, series, text
    _check_lengths(temperatures=temperatures, entropy_bits=entropy_bits)
    temperatures = series("temperatures", temperatures, low=0)
    entropy_bits = series("entropy_bits", entropy_bits, low=0)
    if min(temperatures) <= 0:
        raise ValueError(f"temperatures must be > 0, got {min(temperatures)}")
    marker_temperature = optional_real("marker_temperature", marker_temperature, low=0)
    marker_entropy = optional_real("marker_entropy", marker_entropy, low=0)
    text("title", title, optional=True)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(temperatures), y=list(entropy_bits), mode="lines", name=tr("entropy"),
                             line={"width": 3, "color": KEPT_COLOR},
                             hovertemplate=tr("T = %{x:.2f}: H = %{y:.2f} bits<extra></extra>")))
    mx = [] if marker_temperature is None else [marker_temperature]
    my = [] if marker_entropy is None else [marker_entropy]
    fig.add_trace(go.Scatter(x=mx, y=my, mode="markers", name=tr("current T"),
                             marker={"size": 16, "color": BASE_COLOR},
                             hovertemplate=tr("T = %{x:.2f}: H = %{y:.2f} bits<extra></extra>")))
    top = max(list(entropy_bits) + [1.0])
    ticks = [v for v in range(0, int(top) + 2, max(1, int(top) // 6 or 1))]
    fig.update_xaxes(title_text=tr("temperature T"))
    fig.update_yaxes(title_text=tr("entropy H (bits)"), tickvals=ticks,
                     ticktext=[f"{v}  (PPL {2 ** v:,.0f})" for v in ticks])
    return _style(fig, title or tr("Entropy and perplexity of the next token vs temperature"), height=420)


def chosen_prob_figure(tokens: Sequence[str], probs: Sequence[float], *,
                       loop_start: int | None = None, title: str | None = None) -> go.Figure:
    """Probability of each generated token, step by step (e.g. a greedy run).

    Args:
        tokens: the generated tokens' display strings, in order (n,).
        probs: the probability the model gave each one at its step (n,), in [0, 1].
        loop_start: index of the first step inside a repetition loop; those bars are coloured.
        title: figure title.

    Returns:
        A figure with one bar trace ``chosen token``.

    Raises:
        ValueError: the sequences differ in length, or ``loop_start`` is outside ``[0, n]``.
    """
    n = _check_lengths(tokens=tokens, probs=probs)
    if loop_start is not None and not 0 <= loop_start <= n:
        raise ValueError(f"loop_start must be in [0, {n}], got {loop_start}")
    colors = [LOOP_COLOR if loop_start is not None and i >= loop_start else KEPT_COLOR for i in range(n)]
    fig = go.Figure(go.Bar(x=list(range(n)), y=list(probs), marker_color=colors, name=tr("chosen token"), customdata=list(tokens),
                           hovertemplate=tr("step %{x}: %{customdata} p = %{y:.3f}<extra></extra>")))
    fig.update_xaxes(title_text=tr("generation step: the token chosen"), tickvals=list(range(n)), ticktext=list(tokens),
                     tickangle=-60, tickfont={"size": 14})
    fig.update_yaxes(title_text=tr("p(chosen token)"), range=[0, 1], tickformat=".0%")
    title = title or tr("Probability of each chosen token")
    if loop_start is not None:
        title = tr("{title}  (orange: inside the loop)", title=title)
    return _style(fig, title, height=460)
