"""Figures of chapter 08 (structured output): the automaton, masked candidates, mask sizes, cost.

Pure functions: numbers, strings and a DFA table in, a ``plotly.graph_objects.Figure`` out.
Nothing here runs a model or imports widgets; ``labsupport.widgets.structured`` and the
chapter compute the numbers with ``labsupport.structured`` and pass them in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from ..i18n import tr
from ..validation import check_int
from .sampling import unique_labels
from .style import FONT_SIZE, LEGEND_TOP, style

ALLOWED_COLOR = "#1f77b4"
REFUSED_COLOR = "#d62728"
BEFORE_COLOR = "#c7c7c7"
ACCEPT_COLOR = "#2ca02c"
MAX_DRAWN_STATES = 40


def _style(fig: go.Figure, title: str, height: int) -> go.Figure:
    return style(fig, title, height, left=10, legend=LEGEND_TOP)


def byte_label(byte_values: Sequence[int]) -> str:
    """A compact label for a set of bytes: ``0-9``, ``"``, ``a-f,x``; bytes ≥ 0x80 as ``≥0x80``."""
    vals = sorted({int(b) for b in byte_values})
    ascii_vals = [b for b in vals if b < 0x80]
    parts, i = [], 0
    while i < len(ascii_vals):
        j = i
        while j + 1 < len(ascii_vals) and ascii_vals[j + 1] == ascii_vals[j] + 1:
            j += 1
        a, b = ascii_vals[i], ascii_vals[j]
        show = (lambda c: repr(chr(c))[1:-1] if 0x20 < c < 0x7F else f"0x{c:02x}")
        parts.append(show(a) if a == b else f"{show(a)}-{show(b)}")
        i = j + 1
    if len(ascii_vals) < len(vals):
        parts.append("≥0x80")
    text = ",".join(parts)
    return text if len(text) <= 14 else text[:12] + "…"


def automaton_layout(transitions: np.ndarray) -> tuple[dict[int, tuple[float, float]], list[tuple[int, int, str]]]:
    """Positions ``{state: (x, y)}`` (x = BFS depth from the start) and labelled edges.

    Args:
        transitions: ``(num_states, 256)`` int table, -1 = no edge (``DFA.transitions``).

    Returns:
        ``(positions, edges)`` with ``edges = [(source, target, byte label), ...]``.

    Raises:
        ValueError: more than ``MAX_DRAWN_STATES`` states (the picture would be unreadable).
    """
    n = transitions.shape[0]
    if n > MAX_DRAWN_STATES:
        raise ValueError(f"the automaton has {n} states; at most {MAX_DRAWN_STATES} can be drawn")
    depth = {0: 0}
    queue = deque([0])
    while queue:
        s = queue.popleft()
        for t in transitions[s]:
            if t >= 0 and int(t) not in depth:
                depth[int(t)] = depth[s] + 1
                queue.append(int(t))
    columns: dict[int, list[int]] = {}
    for s in sorted(depth):
        columns.setdefault(depth[s], []).append(s)
    pos = {}
    for d, states in columns.items():
        for k, s in enumerate(states):
            pos[s] = (float(d), (len(states) - 1) / 2 - k)
    edges = []
    for s in range(n):
        targets: dict[int, list[int]] = {}
        for b, t in enumerate(transitions[s]):
            if t >= 0:
                targets.setdefault(int(t), []).append(b)
        edges += [(s, t, byte_label(bs)) for t, bs in targets.items()]
    return pos, edges


def automaton_figure(transitions: np.ndarray, accepting: Sequence[bool], *, current: int | None = None,
                     title: str | None = None) -> go.Figure:
    """State/transition picture of a small DFA: circles are states (0 = start, green ring =
    accepting), arrows carry the bytes that move along them; ``current`` is highlighted (default
    title "The automaton: states and byte transitions").

    Raises:
        ValueError: too many states to draw (see :func:`automaton_layout`).
    """
    pos, edges = automaton_layout(np.asarray(transitions))
    title = tr("The automaton: states and byte transitions") if title is None else title
    fig = go.Figure()
    annotations = []
    for s, t, label in edges:
        (x0, y0), (x1, y1) = pos[s], pos[t]
        if s == t:                                                  # self-loop: a label above
            annotations.append({"x": x0, "y": y0 + 0.32, "text": f"↻ {label}", "showarrow": False,
                                "font": {"size": FONT_SIZE - 3, "color": "#444"}})
            continue
        annotations.append({"x": x1, "y": y1, "ax": x0, "ay": y0, "xref": "x", "yref": "y", "axref": "x",
                            "ayref": "y", "showarrow": True, "arrowhead": 2, "arrowsize": 1.2,
                            "standoff": 14, "startstandoff": 14, "arrowcolor": "#888", "text": ""})
        annotations.append({"x": (x0 + x1) / 2, "y": (y0 + y1) / 2 + 0.12, "text": label, "showarrow": False,
                            "font": {"size": FONT_SIZE - 3, "color": "#333"}, "bgcolor": "rgba(255,255,255,0.8)"})
    states = sorted(pos)
    acc = [bool(accepting[s]) for s in states]
    fig.add_trace(go.Scatter(
        x=[pos[s][0] for s in states], y=[pos[s][1] for s in states], mode="markers+text", name=tr("state"),
        text=[str(s) for s in states], textfont={"size": FONT_SIZE, "color": "white"},
        marker={"size": 34, "color": ["#ff7f0e" if s == current else ALLOWED_COLOR for s in states],
                "line": {"width": [5 if a else 0 for a in acc], "color": ACCEPT_COLOR}},
        hovertext=[tr("state {s} (accepting)", s=s) if a else tr("state {s}", s=s) for s, a in zip(states, acc)],
        hoverinfo="text"))
    ys = [pos[s][1] for s in states]
    xs = [pos[s][0] for s in states]
    fig.update_layout(annotations=annotations, showlegend=False,
                      xaxis={"visible": False, "range": [min(xs) - 0.5, max(xs) + 0.5]},
                      yaxis={"visible": False, "range": [min(ys) - 0.8, max(ys) + 0.8]})
    return _style(fig, title, 380)


def pick_candidates(model_probs, masked_probs, n: int) -> list[int]:
    """``n`` token ids to show: the ``n // 2`` most likely *allowed* ones (masked probability > 0)
    and the model's favourites after them, ordered by the model's probability.

    Args:
        model_probs, masked_probs: ``(vocab,)`` tensors (or sequences) of probabilities.
        n: how many ids (≥ 2, at most the vocabulary).
    """
    order_masked = sorted(range(len(masked_probs)), key=lambda i: -float(masked_probs[i]))
    chosen = [i for i in order_masked[:n // 2] if float(masked_probs[i]) > 0]
    for i in sorted(range(len(model_probs)), key=lambda i: -float(model_probs[i])):
        if len(chosen) >= n:
            break
        if i not in chosen:
            chosen.append(i)
    return sorted(chosen, key=lambda i: -float(model_probs[i]))


def masked_candidates_figure(tokens: Sequence[str], probs_before: Sequence[float], probs_after: Sequence[float],
                             allowed: Sequence[bool], *, title: str | None = None) -> go.Figure:
    """Bars of the model's probability (grey) and the distribution actually sampled from (blue/red).

    A refused candidate's masked probability is exactly 0: it is drawn in a third trace, red, labelled
    "0" (so the legend's colours are the bars' colours). Traces: ``model``, ``sampled from`` (blue,
    the allowed tokens) and, when any token is refused, ``refused by the grammar``. Default title:
    "Top candidates: model vs grammar-masked".

    Raises:
        ValueError: the sequences differ in length.
    """
    n = len(tokens)
    if not len(probs_before) == len(probs_after) == len(allowed) == n:
        raise ValueError("tokens, probs_before, probs_after and allowed must have the same length")
    title = tr("Top candidates: model vs grammar-masked") if title is None else title
    labels = unique_labels(list(tokens))
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=list(probs_before), name=tr("model (no grammar)"), marker_color=BEFORE_COLOR))
    fig.add_trace(go.Bar(x=labels, y=[p if a else None for p, a in zip(probs_after, allowed)],
                         name=tr("sampled from (mask + temperature)"), marker_color=ALLOWED_COLOR, offsetgroup="after"))
    if not all(allowed):                       # refused: probability 0, its own legend entry in red
        fig.add_trace(go.Bar(x=labels, y=[None if a else 0.0 for a in allowed], name=tr("refused by the grammar (p = 0)"),
                             marker_color=REFUSED_COLOR, offsetgroup="after", text=["" if a else "0" for a in allowed],
                             textposition="outside", textfont={"color": REFUSED_COLOR}))
    fig.update_layout(barmode="group", xaxis={"type": "category", "title": tr("candidate token")},
                      yaxis={"title": tr("probability"), "range": [0, 1]})
    return _style(fig, title, 380)


def allowed_count_figure(tokens: Sequence[str], counts: Sequence[int], vocab_size: int, *,
                         title: str | None = None) -> go.Figure:
    """How many of the vocabulary's tokens the grammar allows before each generated token (log scale);
    default title "Allowed tokens at each step".

    Raises:
        ValueError: ``tokens`` and ``counts`` differ in length.
    """
    if len(tokens) != len(counts):
        raise ValueError("tokens and counts must have the same length")
    title = tr("Allowed tokens at each step") if title is None else title
    fig = go.Figure(go.Bar(x=list(range(len(tokens))), y=list(counts), text=list(tokens),
                           textposition="outside", name=tr("allowed tokens"), marker_color=ALLOWED_COLOR))
    fig.update_layout(xaxis={"title": tr("step (the chosen token is written above its bar)")},
                      yaxis={"title": tr("allowed of {vocab:,}", vocab=vocab_size), "type": "log"})
    return _style(fig, title, 360)


def stack_figure(tokens: Sequence[str], depths: Sequence[int], brackets: Sequence[int], *,
                 title: str | None = None) -> go.Figure:
    """The pushdown matcher's stack depth (frames) after each token, beside the text's bracket
    depth; the tokens label the x axis. Default title "The stack follows the nesting".

    Raises:
        TypeError: a depth or bracket count is not an integer.
        ValueError: the three sequences differ in length, or a count is negative.
    """
    if not len(tokens) == len(depths) == len(brackets):
        raise ValueError(f"tokens, depths and brackets must have the same length, got {len(tokens)}, "
                         f"{len(depths)} and {len(brackets)}")
    depths = [check_int(f"depths[{i}]", d, 0) for i, d in enumerate(depths)]
    brackets = [check_int(f"brackets[{i}]", d, 0) for i, d in enumerate(brackets)]
    title = tr("The stack follows the nesting") if title is None else title
    x = list(range(len(tokens)))
    labels = [repr(str(t))[1:-1] for t in tokens]
    fig = go.Figure(go.Bar(x=x, y=depths, name=tr("stack frames after the token"), marker_color=ALLOWED_COLOR,
                           customdata=labels, hovertemplate="%{customdata}: %{y}<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=brackets, mode="lines+markers", line={"shape": "hv", "color": ACCEPT_COLOR},
                             name=tr("open brackets in the text"), yaxis="y2"))
    fig.update_layout(xaxis={"title": tr("token"), "tickmode": "array", "tickvals": x, "ticktext": labels,
                             "tickangle": 0},
                      yaxis={"title": tr("stack frames"), "range": [0, max([*depths, 1]) * 1.15]},
                      yaxis2={"title": tr("open brackets"), "overlaying": "y", "side": "right",
                              "range": [0, max([*brackets, 1]) * 1.15], "showgrid": False})
    return _style(fig, title, 380)


def cost_figure(names: Sequence[str], ours_us: Sequence[float], peer_us: Sequence[float] | None,
                decode_us: float, *, title: str | None = None) -> go.Figure:
    """Bars of our mask step and XGrammar's (µs) beside one model decode step (a dashed line);
    default title "Cost of the mask per decode step".

    Raises:
        ValueError: lengths differ.
    """
    if len(names) != len(ours_us) or (peer_us is not None and len(peer_us) != len(names)):
        raise ValueError("names, ours_us and peer_us must have the same length")
    title = tr("Cost of the mask per decode step") if title is None else title
    fig = go.Figure(go.Bar(x=list(names), y=list(ours_us), name=tr("ours (cached mask)"), marker_color=ALLOWED_COLOR))
    if peer_us is not None:
        fig.add_trace(go.Bar(x=list(names), y=list(peer_us), name="XGrammar", marker_color="#9467bd"))
    fig.add_hline(y=decode_us, line_dash="dash", line_color=REFUSED_COLOR)
    # the label as its own annotation: on a log axis an annotation's y is the exponent (log10), which
    # add_hline's own label does not do, so it would float off the chart
    fig.add_annotation(x=0, xref="paper", xanchor="left", y=math.log10(decode_us), yref="y", yanchor="bottom",
                       yshift=2, bgcolor="rgba(255,255,255,0.8)", text=tr("one model decode step: {us:,.0f} µs", us=decode_us), showarrow=False,
                       font={"color": REFUSED_COLOR})
    values = [v for v in list(ours_us) + list(peer_us or []) + [decode_us] if v > 0]
    low, high = min(values), max(values)                   # every bar visible above the axis floor
    fig.update_layout(barmode="group", yaxis={"title": tr("µs per step (log)"), "type": "log", "dtick": 1,
                                              "range": [math.log10(low) - 0.6, math.log10(high) + 0.5]})
    return _style(fig, title, 380)
