"""Figures of beam search: the search tree, and how the length penalty reorders finished hypotheses.

Pure functions ``data → go.Figure``. Every figure built here always has the same traces in the
same order (some may be empty), so a panel can copy a new figure's data into a
``go.FigureWidget`` in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from ..beam import BeamSearchResult, length_normalised_score
from ..i18n import tr
from ..validation import check_int
from .style import FONT

COLOURS = {"kept": "#1f77b4", "pruned": "#b0b0b0", "finished": "#2ca02c", "best": "#d62728", "root": "#444444"}

def display_text(text: str) -> str:
    """Text for a title or label: newlines shown as ⏎, no quotes or escape characters."""
    return text.replace("\r", "").replace("\n", "⏎")


#: Trace names of :func:`beam_tree_figure`, in order (in English; :func:`tree_trace_names` gives
#: them in the current language).
TREE_TRACES = ("pruned edges", "beam edges", "best path", "pruned", "beam", "finished", "prompt")


def tree_trace_names() -> dict[str, str]:
    """:data:`TREE_TRACES` → the name shown in the legend, in the current language."""
    return {"pruned edges": tr("pruned edges"), "beam edges": tr("beam edges"), "best path": tr("best path"),
            "pruned": tr("pruned"), "beam": tr("beam"), "finished": tr("finished"), "prompt": tr("prompt")}


def _status_text(status: str) -> str:
    """A node's status (``"kept"``, ``"pruned"``, ``"finished"``, ``"root"``) as the hover text says it."""
    shown = {"kept": tr("kept"), "pruned": tr("pruned"), "finished": tr("finished"), "root": tr("root")}
    return shown.get(status, status)


def _visible_nodes(result: BeamSearchResult, max_children: int) -> list[int]:
    """Node ids to draw: each expanded beam's ``max_children`` most likely children plus every
    kept or finished one (and anything on the best path)."""
    best = set(result.path(result.best.node_id)) if result.hypotheses else set()
    children: dict[int, list[int]] = {}
    for node in result.nodes[1:]:
        children.setdefault(node.parent_id, []).append(node.node_id)
    shown = [0]
    for kids in children.values():
        kids = sorted(kids, key=lambda i: result.nodes[i].logprob, reverse=True)
        for rank, i in enumerate(kids):
            node = result.nodes[i]
            if rank < max_children or node.status in ("kept", "finished") or i in best:
                shown.append(i)
    return shown


def _layout_positions(result: BeamSearchResult, shown: Sequence[int]) -> dict[int, tuple[float, float]]:
    """x = depth; y = rank within the depth, children grouped under their parent (best on top),
    each column centred on 0."""
    by_depth: dict[int, list[int]] = {}
    for i in shown:
        by_depth.setdefault(result.nodes[i].depth, []).append(i)
    pos: dict[int, tuple[float, float]] = {0: (0.0, 0.0)}
    for depth in sorted(by_depth)[1:]:
        ids = by_depth[depth]
        ids.sort(key=lambda i: (pos[result.nodes[i].parent_id][1] * -1, -result.nodes[i].cum_logprob))
        n = len(ids)
        for rank, i in enumerate(ids):
            pos[i] = (float(depth), (n - 1) / 2 - rank)
    return pos


#: Pixel sizes the tree's layout plans with (plotly draws text in the page's sans-serif font).
LABEL_FONTS = (15, 14, 13, 12, 11)     # label font sizes tried, largest first
MARGIN = {"l": 30, "r": 10, "t": 100, "b": 60}
ROW_PX = 34                            # vertical pixels per node in the fullest column
MARKER_GAP_PX = 20                     # a label starts right of its marker and ends before the next column's


def text_width_px(text: str, size: float) -> float:
    """A generous estimate of ``text``'s width in pixels at font ``size``: 0.6 em per ASCII
    character (0.75 for capitals), 1 em for any other (``␣``, ``⏎`` and non-Latin glyphs come
    from wider fallback fonts). Measured in Chromium, real labels are 65-95 % of it."""
    return sum(0.75 if ch.isupper() and ord(ch) < 128 else 0.6 if ord(ch) < 128 else 1.0 for ch in text) * size


def _shorten(text: str, room_px: float, size: float) -> str:
    """``text``, or its longest prefix + ``…`` that fits in ``room_px`` at font ``size``."""
    if text_width_px(text, size) <= room_px:
        return text
    while text and text_width_px(text + "…", size) > room_px:
        text = text[:-1]
    return text + "…" if text else ""


def _plan_labels(depth: int, interior: Sequence[tuple[str, str]], last: Sequence[str], width: int) -> dict:
    """Choose the x range, the label font and each label's text so no label runs into the next column.

    ``interior``: (token, "token (number)") per labelled node before the last column; ``last``: the
    last column's labels (they get the room right of it). Returns pixels per depth step, the x
    range, the font size and the label texts.
    """
    plot_px = width - MARGIN["l"] - MARGIN["r"]
    left = 12.0                                                     # the root's marker
    # with the numbers at a readable size if they fit, else tokens only, the font shrinking
    tries = [(size, True) for size in LABEL_FONTS if size >= 13] + [(size, False) for size in LABEL_FONTS]
    for size, numbers in tries:
        tail = max((text_width_px(t, size) for t in last), default=0.0) + MARKER_GAP_PX
        step = (plot_px - left - tail) / max(depth, 1)
        room = step - MARKER_GAP_PX
        if all(text_width_px(full if numbers else tok, size) <= room for tok, full in interior):
            break
    texts = [full if numbers else _shorten(tok, room, size) for tok, full in interior]
    return {"step_px": step, "x_range": [-left / step, depth + tail / step], "size": size, "texts": texts}


def beam_tree_figure(result: BeamSearchResult, max_children: int = 3, title: str | None = None,
                     prompt_label: str | None = None, width: int | None = None) -> go.Figure:
    """The search tree: nodes are partial hypotheses labelled with their token and cumulative log₂ p.

    Live beams are blue, pruned candidates faded grey, finished hypotheses green squares (EOS)
    or diamonds (length limit), the best hypothesis's path bold red. Labels are planned for the
    figure's width so none runs into the next column: the font shrinks (15 → 11 px) as the tree
    deepens, the cumulative log₂ p is dropped from the label when it does not fit (the last
    column always shows it), a long token is shortened with ``…``; hovering a node shows its
    full token and numbers.

    Args:
        result: a :class:`~labsupport.beam.BeamSearchResult`.
        max_children: children drawn per expanded beam besides the kept/finished ones (≥ 1).
        title: figure title (default: width, α and the best text).
        prompt_label: the prompt's text, shown when hovering the root (its last 40 characters;
            default: the word "prompt"); the root's tick on the depth axis reads "prompt".
        width: figure width in pixels (default: the container's; the labels are then planned
            for 940 px).

    Raises:
        TypeError: a count that is not an integer.
        ValueError: ``max_children < 1``.
    """
    check_int("max_children", max_children, 1)
    shown = _visible_nodes(result, max_children)
    pos = _layout_positions(result, shown)
    best = set(result.path(result.best.node_id)) if result.hypotheses else set()
    nodes = result.nodes
    depth = max((nodes[i].depth for i in shown), default=0)
    rows = max((sum(1 for i in shown if nodes[i].depth == d) for d in range(depth + 1)), default=1)

    def edges(ids):
        xs, ys = [], []
        for i in ids:
            px, py = pos[nodes[i].parent_id]
            x, y = pos[i]
            xs += [px, x, None]
            ys += [py, y, None]
        return xs, ys

    groups = {"pruned": [], "beam": [], "finished": []}
    for i in shown[1:]:
        status = nodes[i].status
        groups["finished" if status == "finished" else "beam" if status == "kept" else "pruned"].append(i)
    best_edges = [i for i in shown[1:] if i in best]

    def full(i):
        return f"{display_text(nodes[i].token)} ({nodes[i].cum_log2:.1f})"

    labelled = groups["beam"] + groups["finished"]
    interior = [i for i in labelled if nodes[i].depth < depth]
    plan = _plan_labels(depth, [(display_text(nodes[i].token), full(i)) for i in interior],
                        [full(i) for i in labelled if nodes[i].depth == depth], width or 940)
    text_of = dict(zip(interior, plan["texts"])) | {i: full(i) for i in labelled if nodes[i].depth == depth}

    def hover(i):
        node = nodes[i]
        text = tr("token {token!r} (id {id})<br>log₂ p(token) = {log2p:.2f}<br>cumulative log₂ p = {cum:.2f}"
                  "<br>status: {status}", token=node.token, id=node.token_id,
                  log2p=node.logprob / 0.6931471805599453, cum=node.cum_log2, status=_status_text(node.status))
        if node.score is not None:
            text += tr("<br>finished ({reason}), score {score:.3f}", reason=node.finish_reason, score=node.score)
        return text

    names = tree_trace_names()
    fig = go.Figure()
    for name, ids, colour, line_width, opacity in (
            ("pruned edges", groups["pruned"], COLOURS["pruned"], 1, 0.5),
            ("beam edges", groups["beam"] + groups["finished"], COLOURS["kept"], 2.5, 1.0),
            ("best path", best_edges, COLOURS["best"], 6, 0.85)):
        xs, ys = edges(ids)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=names[name], opacity=opacity, hoverinfo="skip",
                                 line={"color": colour, "width": line_width}, showlegend=name == "best path"))
    for name, ids, colour, opacity in (("pruned", groups["pruned"], COLOURS["pruned"], 0.55),
                                       ("beam", groups["beam"], COLOURS["kept"], 1.0),
                                       ("finished", groups["finished"], COLOURS["finished"], 1.0)):
        symbols = ["square" if nodes[i].finish_reason == "stop" else "diamond" for i in ids] \
            if name == "finished" else "circle"
        line_w = [4 if i in best else 1 for i in ids]
        fig.add_trace(go.Scatter(
            x=[pos[i][0] for i in ids], y=[pos[i][1] for i in ids], mode="markers+text", name=names[name],
            opacity=opacity, text=["" if name == "pruned" else text_of[i] for i in ids], textposition="middle right",
            textfont={"size": plan["size"], "color": "#111111"},
            hovertext=[hover(i) for i in ids], hoverinfo="text",
            marker={"size": 13 if name != "pruned" else 9, "color": colour, "symbol": symbols,
                        "line": {"color": [COLOURS["best"] if i in best else "white" for i in ids], "width": line_w}}))
    prompt_label = tr("prompt") if prompt_label is None else prompt_label
    short = prompt_label if len(prompt_label) <= 40 else "…" + prompt_label[-39:]
    fig.add_trace(go.Scatter(x=[0], y=[0], mode="markers", name=names["prompt"], hoverinfo="text",
                             hovertext=[tr("prompt: “{text}”", text=display_text(short))],
                             marker={"size": 15, "color": COLOURS["root"]}, showlegend=False))
    if title is None and result.hypotheses:
        b = result.best
        title = tr("Beam search, B = {width}, α = {alpha:g}: best “{text}” "
                   "(Σ log₂ p = {bits:.1f}, score Σ ln p / len^α = {score:.2f})",
                   width=result.beam_width, alpha=result.length_penalty, text=display_text(b.text),
                   bits=b.log2prob, score=b.score)
    fig.update_layout(title={"text": title, "font": {"size": 17}}, font=FONT, template="plotly_white",
                      height=max(380, ROW_PX * rows + 140), width=width, margin=MARGIN,
                      legend={"orientation": "h", "y": 1.0, "x": 1.0, "xanchor": "right", "yanchor": "bottom"},
                      hovermode="closest")
    fig.update_xaxes(title=tr("generated tokens (depth)"), range=plan["x_range"], tickvals=list(range(depth + 1)),
                     ticktext=[tr("prompt")] + [str(d) for d in range(1, depth + 1)], zeroline=False)
    fig.update_yaxes(visible=False, range=[-(rows / 2) - 0.5, rows / 2 + 0.5])
    return fig


def length_penalty_figure(candidates: Sequence[tuple[str, float, int]],
                          alphas: Sequence[float] | None = None, marked_alpha: float | None = None,
                          relative: bool = False) -> go.Figure:
    """Score ``Σ log p / len^α`` of each finished hypothesis as α varies: where lines cross, the winner changes.

    Args:
        candidates: ``(label, Σ ln p, length)`` per hypothesis.
        alphas: α values on the x axis (default 0 … 2 in steps of 0.05).
        marked_alpha: draw a vertical line here (e.g. the panel's current α).
        relative: plot each score minus the best score at that α, so the winner lies on 0 and
            the order stays readable when the scores' scale changes a lot with α; the y axis is
            then clipped to [-1.5, 0.1] (lines below it are far behind the winner).

    Raises:
        ValueError: no candidates, or a length < 1.
    """
    if not candidates:
        raise ValueError("candidates must hold at least one (label, logprob, length), got none")
    alphas = list(alphas) if alphas is not None else [i / 20 for i in range(41)]
    fig = go.Figure()
    scores = [[length_normalised_score(logprob, length, a) for a in alphas] for _, logprob, length in candidates]
    if relative:
        top = [max(col) for col in zip(*scores)]
        scores = [[v - t for v, t in zip(row, top)] for row in scores]
    for (label, _, length), ys in zip(candidates, scores):
        fig.add_trace(go.Scatter(x=alphas, y=ys, mode="lines", name=tr("{label} (len {length})", label=display_text(label), length=length),
                                 line={"width": 3}))
    if marked_alpha is not None:
        fig.add_vline(x=marked_alpha, line={"dash": "dash", "color": "#555555"})
    fig.update_layout(title={"text": tr("Length normalisation: score = Σ log p / len^α"), "font": {"size": 17}},
                      font=FONT, template="plotly_white", height=420, legend={"font": {"size": 14}})
    fig.update_xaxes(title=tr("length penalty α"))
    if relative:
        fig.update_yaxes(title=tr("score − best score at this α"), range=[-1.5, 0.1])
    else:
        fig.update_yaxes(title=tr("score (nats per len^α)"))
    return fig
