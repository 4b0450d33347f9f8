"""Figures of chapter 07 (speculative variants): a verified token tree, measured vs predicted
speed-up, speed-up against batch size.

Pure functions: numbers and strings in, a ``plotly.graph_objects.Figure`` out. Colours as in
chapter 06: green = accepted, purple = the target's own next token, grey = rejected candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import plotly.graph_objects as go

from ..i18n import tr
from .speculative import ACCEPTED, BONUS, DISCARDED, MEASURED, THEORY, _style
from .style import FONT_SIZE

__all__ = ["batch_sweep_figure", "measured_vs_predicted_figure", "token_tree_figure", "tree_layout"]


def tree_layout(parents: Sequence[int]) -> list[tuple[float, float]]:
    """``(x = depth, y = row)`` of every node: leaves on consecutive rows, a parent at the middle of
    its children (a tidy layered drawing). ``parents[0] == -1``."""
    children: dict[int, list[int]] = {i: [] for i in range(len(parents))}
    for i, p in enumerate(parents[1:], 1):
        children[p].append(i)
    pos: dict[int, tuple[float, float]] = {}
    row = [0.0]

    def place(node: int, depth: int) -> float:
        if not children[node]:
            y, row[0] = row[0], row[0] + 1
        else:
            ys = [place(c, depth + 1) for c in children[node]]
            y = (ys[0] + ys[-1]) / 2
        pos[node] = (float(depth), y)
        return y

    place(0, 0)
    return [pos[i] for i in range(len(parents))]


def token_tree_figure(tokens: Sequence[int], parents: Sequence[int], path: Sequence[int], next_token: int | None = None,
                      label: Callable[[int], str] | None = None, *, title: str | None = None) -> go.Figure:
    """The tree of one round: the root (pending token), every candidate, the accepted path in green
    and the target's own next token (purple) after it (default title "Verified token tree").

    Traces (fixed): edges, accepted edges, nodes, next token. Labels sit right of their node, at most
    10 characters (the whole token on hover); a tree deeper than 12 levels shows hover labels only.

    Raises:
        TypeError / ValueError: a malformed tree (``parents[0] != -1``, a parent that is not an earlier
            node, lengths that differ), a ``path`` that is not a chain from the root, a ``label`` that
            does not return text, a ``next_token`` that is not an integer.
    """
    from ..validation import check_int, is_int

    if len(tokens) == 0 or len(tokens) != len(parents) or parents[0] != -1:
        raise ValueError(f"a token tree needs a root (parents[0] = -1) and one parent per token, got "
                         f"{len(tokens)} tokens and parents {list(parents)[:4]}…")
    for i, p in enumerate(parents[1:], 1):
        if not is_int(p) or not 0 <= p < i:
            raise ValueError(f"parents[{i}] must be an earlier node in [0, {i}), got {p!r}")
    for depth, node in enumerate(path):
        check_int(f"path[{depth}]", node, 1, len(tokens) - 1)
        if parents[node] != (path[depth - 1] if depth else 0):
            raise ValueError(f"path must be a chain from the root, but node {node} is not a child of "
                             f"{path[depth - 1] if depth else 0}")
    if next_token is not None:
        check_int("next_token", next_token, 0)
    label = label or str
    title = tr("Verified token tree") if title is None else title
    if not all(isinstance(label(int(t)), str) for t in tokens[:1]):
        raise TypeError(f"label must return text, got {type(label(int(tokens[0]))).__name__}")
    xy = tree_layout(parents)
    on_path = {0, *path}
    ex, ey, ax, ay = [], [], [], []
    for i, p in enumerate(parents[1:], 1):
        xs, ys = (ax, ay) if i in on_path and p in on_path else (ex, ey)
        xs += [xy[p][0], xy[i][0], None]
        ys += [xy[p][1], xy[i][1], None]
    colours = [BONUS if i == 0 else ACCEPTED if i in on_path else DISCARDED for i in range(len(tokens))]
    def short(token: int) -> str:                      # at most 10 characters: labels never run into the next depth
        shown = repr(label(int(token)))[1:-1]
        return shown if len(shown) <= 10 else shown[:9] + "…"

    text = [short(t) for t in tokens]
    deep = max(p[0] for p in xy)
    last = path[-1] if path else 0
    nx = [xy[last][0] + 1] if next_token is not None else []
    ny = [xy[last][1] + 0.45] if next_token is not None else []      # between two rows: never on a rejected node's label
    fig = go.Figure([
        go.Scatter(x=ex, y=ey, mode="lines", line={"color": DISCARDED, "width": 2}, name=tr("candidate edge"),
                   hoverinfo="skip"),
        go.Scatter(x=ax, y=ay, mode="lines", line={"color": ACCEPTED, "width": 5}, name=tr("accepted path"),
                   hoverinfo="skip"),
        go.Scatter(x=[p[0] for p in xy], y=[p[1] for p in xy], mode="markers+text" if deep <= 12 else "markers",
                   text=text, hovertext=[label(int(t)) for t in tokens], textposition="middle right", marker={"size": 16, "color": colours, "line": {"width": 1, "color": "#333"}},
                   name=tr("nodes (root purple, accepted green)"), textfont={"size": FONT_SIZE - 2}),
        go.Scatter(x=nx, y=ny, mode="markers+text", text=[short(next_token)] if nx else [],
                   textposition="middle right", marker={"size": 16, "color": BONUS, "symbol": "star"},
                   name=tr("target's next token"), textfont={"size": FONT_SIZE - 2}),
    ])
    fig.update_xaxes(title=tr("depth (position after the pending token)"), dtick=1,
                     range=[-0.3, max(p[0] for p in xy) + (1 if nx else 0) + 0.8])          # room for the labels on the right
    fig.update_yaxes(visible=False, autorange="reversed")
    rows = max(p[1] for p in xy) + 1                                                      # leaves, one row each
    return _style(fig, title, int(max(380, 26 * rows + 150)))                            # a label per row, never stacked


def measured_vs_predicted_figure(rows: Sequence, *, band: float = 0.15,
                                 title: str | None = None) -> go.Figure:
    """One marker per row (``method``, ``prompt``, ``batch``, ``predicted``, ``measured``), the
    diagonal and a ±``band`` corridor (default title "Measured vs predicted speed-up")."""
    title = tr("Measured vs predicted speed-up") if title is None else title
    hi = max([1.2] + [max(r.predicted, r.measured) for r in rows]) * 1.1
    fig = go.Figure([
        go.Scatter(x=[0, hi], y=[0, hi], mode="lines", line={"color": THEORY, "dash": "dot"}, name=tr("measured = predicted")),
        go.Scatter(x=[0, hi, hi, 0], y=[0, hi * (1 + band), hi * (1 - band), 0], fill="toself", mode="none",
                   fillcolor="rgba(31,119,180,0.1)", name=f"±{band:.0%}"),
        go.Scatter(x=[r.predicted for r in rows], y=[r.measured for r in rows], mode="markers",
                   marker={"size": 11, "color": [MEASURED if r.batch == 1 else THEORY for r in rows]},
                   text=[tr("{method} · {prompt} · batch {batch}", method=r.method, prompt=r.prompt, batch=r.batch)
                         for r in rows], hoverinfo="text+x+y",
                   name=tr("methods (orange: batch 1, blue: batch 8)")),
    ])
    fig.update_xaxes(title=tr("predicted = (p + n) / (p + n / dec), dec = tokens per round / (c + v)"), range=[0, hi])
    fig.update_yaxes(title=tr("measured wall-clock speed-up"), range=[0, hi])
    return _style(fig, title, 430)


def batch_sweep_figure(speedups: Mapping[int, float], *, method: str = "",
                       title: str | None = None) -> go.Figure:
    """Measured speed-up at each batch size with the break-even line at 1 (default title
    "Speed-up against batch size")."""
    title = tr("Speed-up against batch size") if title is None else title
    b = sorted(speedups)
    fig = go.Figure([
        go.Scatter(x=b, y=[speedups[k] for k in b], mode="lines+markers", name=method or tr("speed-up"),
                   line={"color": MEASURED, "width": 3}, marker={"size": 10}),
        go.Scatter(x=[b[0], b[-1]], y=[1, 1], mode="lines", line={"color": "#555", "dash": "dash"},
                   name=tr("plain decoding (1×)")),
    ])
    fig.update_xaxes(title=tr("batch size (sequences per step)"), type="log", tickvals=b)
    fig.update_yaxes(title=tr("speed-up over plain decoding"))
    return _style(fig, title, 360)
