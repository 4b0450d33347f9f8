"""Figures for the PagedAttention chapter: KV memory grids, block tables, block-size trade-off,
copy-on-write and prefix caching. Pure functions ``data → go.Figure`` (no widgets, no engine).

Colour code used throughout: one colour per request; a dark cell holds a token's KV, a
light cell of the same colour is held (reserved or allocated) but empty, white is free.
Shared blocks (ref count > 1) are drawn grey with their ref count written on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..i18n import tr
from ..validation import check_int
from .style import style

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#e377c2", "#8c564b",
           "#bcbd22", "#393b79", "#637939", "#ad494a")
SHARED = "#555555"


def request_colour(index: int) -> str:
    """The palette colour of the ``index``-th request (cycles through 12 colours)."""
    return PALETTE[int(index) % len(PALETTE)]


def _rgb(hex_colour: str) -> np.ndarray:
    h = hex_colour.lstrip("#")
    return np.array([int(h[i:i + 2], 16) for i in (0, 2, 4)], dtype=np.float64)


def _light(hex_colour: str, amount: float = 0.72) -> str:
    c = _rgb(hex_colour) * (1 - amount) + 255 * amount
    return "#" + "".join(f"{round(v):02x}" for v in c)


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    return style(fig, title, height, left=70)


def _policy_name(name: str) -> str:
    """The allocator's name as the reader reads it (``"contiguous"``, ``"paged"``; others as given)."""
    return {"contiguous": tr("contiguous"), "paged": tr("paged")}.get(name, name)


def _counters_text(name: str, c: Mapping) -> str:
    """One memory's headline: ``<b>paged</b>: running 5, queued 0, waste 3 %, done 12``."""
    return tr("<b>{name}</b>: running {running}, queued {queued}, waste {waste:.0f} %, done {done}",
              name=_policy_name(name), running=c["running"], queued=c["queued"], waste=100 * c["waste"],
              done=c["completed"])


def _grid_title(step: int) -> str:
    return tr("KV memory at step {step}: one cell = one token slot (dark = KV, light = held but empty)", step=step)


# ----------------------------------------------------------------------------- memory grids

def memory_image(owner: np.ndarray, used: np.ndarray, columns: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """RGB image ``(rows, columns, 3)`` of a KV memory and its hover text ``(rows, columns)``.

    Args:
        owner: ``(memory_tokens,)`` request id holding each slot, -1 when free.
        used: ``(memory_tokens,)`` whether the slot holds a token's KV.
        columns: slots per image row.

    Raises:
        ValueError: shapes differ, or ``memory_tokens`` is not a multiple of ``columns``.
    """
    owner, used = np.asarray(owner), np.asarray(used, dtype=bool)
    if owner.shape != used.shape or owner.ndim != 1:
        raise ValueError(f"owner and used must be 1-D of the same shape, got {owner.shape} and {used.shape}")
    if columns < 1 or owner.size % columns:
        raise ValueError(f"columns must divide memory_tokens={owner.size}, got {columns}")
    img = np.full((owner.size, 3), 255.0)
    text = np.empty(owner.size, dtype=object)
    text[:] = tr("free")
    for rid in np.unique(owner[owner >= 0]):
        base = request_colour(int(rid))
        mine = owner == rid
        img[mine & used] = _rgb(base)
        img[mine & ~used] = _rgb(_light(base))
        text[mine & used] = tr("request {rid} · KV", rid=rid)
        text[mine & ~used] = tr("request {rid} · empty (held)", rid=rid)
    rows = owner.size // columns
    return img.reshape(rows, columns, 3).astype(np.uint8), text.reshape(rows, columns)


def block_boundaries(block_size: int, memory_tokens: int, columns: int = 64) -> list[tuple[float, float, float, float]]:
    """Line segments ``(x0, y0, x1, y1)`` (image pixel coordinates) between blocks of a memory
    image: vertical lines when a block is part of a row, horizontal ones when it spans whole rows.
    Empty when blocks do not line up with the rows (or are single slots)."""
    rows = memory_tokens // columns
    if 2 <= block_size < columns and columns % block_size == 0:
        return [(k - 0.5, -0.5, k - 0.5, rows - 0.5) for k in range(block_size, columns, block_size)]
    if block_size >= columns and block_size % columns == 0:
        step = block_size // columns
        return [(-0.5, r - 0.5, columns - 0.5, r - 0.5) for r in range(step, rows, step)]
    return []


def fragmentation_figure(grids: Mapping[str, tuple[np.ndarray, np.ndarray]], counters: Mapping[str, Mapping],
                         step: int, columns: int = 64, block_sizes: Mapping[str, int] | None = None) -> go.Figure:
    """Two KV memories side by side (the classic contiguous-vs-paged simulator).

    Args:
        grids: ``{"contiguous": (owner, used), "paged": (owner, used)}`` at one step, each a
            ``(memory_tokens,)`` array (see :func:`memory_image`).
        counters: per policy ``{"running", "queued", "waste", "completed"}`` at that step.
        step: the step shown (for the title).
        columns: slots per row of the drawing.
        block_sizes: per policy, its block size; white lines are drawn between blocks.
    """
    names = list(grids)
    titles = [_counters_text(name, counters[name]) for name in names]
    fig = make_subplots(rows=len(names), cols=1, subplot_titles=titles, vertical_spacing=0.12)
    for i, name in enumerate(names, start=1):
        img, text = memory_image(*grids[name], columns=columns)
        fig.add_trace(go.Image(z=img, text=text, hovertemplate=tr("slot row %{y}, col %{x}<br>%{text}<extra></extra>"),
                               name=_policy_name(name)), row=i, col=1)
        fig.update_xaxes(showticklabels=False, row=i, col=1)
        fig.update_yaxes(showticklabels=False, row=i, col=1)
        for x0, y0, x1, y1 in block_boundaries((block_sizes or {}).get(name, 1), img.shape[0] * columns, columns):
            fig.add_shape(type="line", x0=x0, y0=y0, x1=x1, y1=y1, line={"color": "white", "width": 2}, row=i, col=1)
        if not (np.asarray(grids[name][0]) >= 0).any():            # all white: say so, or it looks broken
            fig.add_annotation(x=(columns - 1) / 2, y=(img.shape[0] - 1) / 2, text=tr("empty: no request holds memory"),
                               showarrow=False, font={"size": 15, "color": "#607d8b"}, row=i, col=1)
    fig.update_annotations(font={"size": 16})
    rows = grids[names[0]][0].size // columns
    return _layout(fig, _grid_title(step), height=160 + len(names) * (rows * 14 + 60))


def fragmentation_counters_figure(series: Mapping[str, Mapping[str, Sequence[float]]], step: int | None = None) -> go.Figure:
    """Running / queued requests, waste of held memory and completed requests over time.

    Args:
        series: per policy ``{"running": [...], "queued": [...], "waste": [...], "completed": [...]}``,
            one value per step.
        step: draw a vertical marker at this step.
    """
    panels = (("running", tr("running requests")), ("queued", tr("queued requests")),
              ("waste", tr("waste of held KV (%)")), ("completed", tr("completed requests")))
    fig = make_subplots(rows=2, cols=2, subplot_titles=[p[1] for p in panels], horizontal_spacing=0.1,
                        vertical_spacing=0.18)
    dash = {"contiguous": "dash", "paged": "solid"}
    colour = {"contiguous": "#d62728", "paged": "#1f77b4"}
    for k, (key, _) in enumerate(panels):
        r, c = divmod(k, 2)
        for name, s in series.items():
            y = np.asarray(s[key], dtype=float) * (100 if key == "waste" else 1)
            fig.add_trace(go.Scatter(y=y, mode="lines", name=_policy_name(name), legendgroup=name, showlegend=k == 0,
                                     line={"color": colour.get(name), "dash": dash.get(name, "solid"), "width": 3}),
                          row=r + 1, col=c + 1)
        fig.update_xaxes(title_text=tr("step"), row=r + 1, col=c + 1)
    if step is not None:
        for k in range(4):
            r, c = divmod(k, 2)
            fig.add_vline(x=step, line={"color": "grey", "dash": "dot"}, row=r + 1, col=c + 1)
    fig.update_annotations(font={"size": 16})
    return _layout(fig, tr("Same request stream, two allocators"), height=560)


# ----------------------------------------------------------------------------- block tables

def block_table_figure(block_tables: Mapping[str, Sequence[int]], num_blocks: int,
                       ref_counts: Sequence[int] | None = None, num_tokens: Mapping[str, int] | None = None,
                       block_size: int | None = None, title: str | None = None, columns: int = 16,
                       cached_blocks: Sequence[int] = (), request_ids: Sequence | None = None) -> go.Figure:
    """Logical blocks of each request (left) → physical blocks of the pool (right).

    Left: one row per request, one cell per logical block, labelled with the physical block
    it maps to. Right: the pool of ``num_blocks`` physical blocks, coloured by the request
    holding it; grey with "×n" when ``n > 1`` requests share it (copy-on-write / prefix
    sharing); hatched-light for cached (evictable) blocks; white when free.

    Args:
        block_tables: ``{request_id: [physical block ids]}``, logical block 0 first.
        num_blocks: size of the pool.
        ref_counts: ref count per physical block (computed from the tables when omitted).
        num_tokens: tokens each request holds (for the fill of its last block).
        block_size: tokens per block (with ``num_tokens``: how full the last block is).
        title: figure title (default: "Block tables", in the reader's language).
        columns: physical blocks per row of the pool drawing.
        cached_blocks: ids of unreferenced blocks that still hold a cached prefix.
        request_ids: rows (and colours) in this order, including requests without blocks
            now — keeps colours and the number of traces fixed while stepping through time.

    Raises:
        TypeError: ``num_blocks`` or a block id not an integer.
        ValueError: a block id outside ``[0, num_blocks)``, or ``ref_counts`` not one
            count >= 0 per physical block.
    """
    check_int("num_blocks", num_blocks, 1)
    check_int("columns", columns, 1)
    if block_size is not None:
        check_int("block_size", block_size, 1)
    if title is None:
        title = tr("Block tables")
    if not isinstance(title, str):
        raise TypeError(f"title must be a str, got {title!r} ({type(title).__name__})")
    if not isinstance(block_tables, Mapping):
        raise TypeError(f"block_tables must map request ids to block ids, got {type(block_tables).__name__}")
    for rid, table in block_tables.items():
        for b in table:
            check_int(f"block_tables[{rid!r}] entries", b)
    if ref_counts is not None:
        ref_counts = [check_int(f"ref_counts[{i}]", n, 0) for i, n in enumerate(ref_counts)]
        if len(ref_counts) != num_blocks:
            raise ValueError(f"ref_counts must have one count per physical block (num_blocks={num_blocks}), "
                             f"got {len(ref_counts)}")
    ids = list(request_ids) if request_ids is not None else list(block_tables)
    ids += [rid for rid in block_tables if rid not in ids]
    colour = {rid: request_colour(i) for i, rid in enumerate(ids)}
    owner: dict[int, str] = {}
    for rid, table in block_tables.items():
        for b in table:
            if not 0 <= b < num_blocks:
                raise ValueError(f"block ids must be in [0, {num_blocks}), got {b} for request {rid!r}")
            owner.setdefault(b, rid)
    refs = list(ref_counts) if ref_counts is not None else [0] * num_blocks
    if ref_counts is None:
        for table in block_tables.values():
            for b in table:
                refs[b] += 1
    width = max([len(t) for t in block_tables.values()] + [1])
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.08,
                        subplot_titles=(tr("logical blocks → physical block id"),
                                        tr("physical pool ({n} blocks)", n=num_blocks)))
    # left: block tables as rows of labelled squares
    xs, ys, colours, labels, hover = [-5], [0], ["white"], [""], [""]   # keeps the trace non-empty
    for row, rid in enumerate(ids):
        table = block_tables.get(rid, [])
        for j, b in enumerate(table):
            xs.append(j)
            ys.append(row)
            shared = refs[b] > 1
            colours.append(SHARED if shared else colour[rid])
            labels.append(str(b))
            if num_tokens is not None and block_size:
                n = min(block_size, num_tokens[rid] - j * block_size)
                hover.append(tr("{rid}: logical {j} → physical {b} (ref count {refs}, {n}/{size} slots filled)",
                                rid=rid, j=j, b=b, refs=refs[b], n=n, size=block_size))
            else:
                hover.append(tr("{rid}: logical {j} → physical {b} (ref count {refs})", rid=rid, j=j, b=b, refs=refs[b]))
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers+text", text=labels, textfont={"color": "white", "size": 14},
                             marker={"symbol": "square", "size": 34, "color": colours, "line": {"color": "white", "width": 1}},
                             hovertext=hover, hoverinfo="text", showlegend=False), row=1, col=1)
    fig.update_xaxes(title_text=tr("logical block"), range=[-0.7, max(width, 4) - 0.3], dtick=1, row=1, col=1)
    fig.update_yaxes(tickvals=list(range(len(ids))), ticktext=[str(r) for r in ids],
                     range=[len(ids) - 0.5, -0.5], row=1, col=1)
    # right: physical pool
    px_, py_, pc, pt, ph, tc = [], [], [], [], [], []
    cached = set(cached_blocks)
    for b in range(num_blocks):
        px_.append(b % columns)
        py_.append(b // columns)
        tc.append("white")
        if refs[b] > 1:
            pc.append(SHARED)
            pt.append(f"{b}<br>×{refs[b]}")
            ph.append(tr("block {b}: shared by {n} sequences", b=b, n=refs[b]))
        elif b in owner:
            pc.append(colour[owner[b]])
            pt.append(str(b))
            ph.append(tr("block {b}: {rid}", b=b, rid=owner[b]))
        elif b in cached:
            pc.append("#cfcfcf")
            pt.append(f"{b}<br>c")
            tc[-1] = "#444444"
            ph.append(tr("block {b}: cached prefix (ref count 0, evictable)", b=b))
        else:
            pc.append("#f4f4f4")
            pt.append(str(b))
            tc[-1] = "#aaaaaa"
            ph.append(tr("block {b}: free", b=b))
    fig.add_trace(go.Scatter(x=px_, y=py_, mode="markers+text", text=pt, textfont={"color": tc, "size": 10},
                             marker={"symbol": "square", "size": 24, "color": pc, "line": {"color": "#bbbbbb", "width": 1}},
                             hovertext=ph, hoverinfo="text", showlegend=False), row=1, col=2)
    rows = -(-num_blocks // columns)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False, range=[-0.7, columns - 0.3], row=1, col=2)
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, range=[rows - 0.5, -0.5], row=1, col=2)
    for rid in ids:                                              # legend: one entry per request
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=str(rid),
                                 marker={"symbol": "square", "size": 14, "color": colour[rid]}), row=1, col=2)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=tr("shared (ref > 1)"),
                             marker={"symbol": "square", "size": 14, "color": SHARED}), row=1, col=2)
    fig.update_annotations(font={"size": 16})
    fig = _layout(fig, title, height=max(360, 120 + 44 * max(len(ids), rows)))
    fig.update_layout(width=950, autosize=False)         # fixed: the pool's squares are sized in pixels
    return fig


# ----------------------------------------------------------------------------- trade-offs

def block_size_tradeoff_figure(rows: Sequence[Mapping], measured_ms: Mapping[int, float] | None = None) -> go.Figure:
    """Waste of held KV and block-table length vs block size (and measured step time, if given).

    Args:
        rows: :func:`labsupport.sim.fragmentation.block_size_sweep` output (``block_size``,
            ``waste``, ``table_entries``, ``completed``).
        measured_ms: optional ``{block_size: ms per engine step}`` measured on the real engine.
    """
    bs = [r["block_size"] for r in rows]
    titles = [tr("waste of held KV (%)"), tr("block-table entries per request")] + (
        [tr("engine decode step (ms)")] if measured_ms else [])
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.1)
    fig.add_trace(go.Scatter(x=bs, y=[100 * r["waste"] for r in rows], mode="lines+markers", showlegend=False,
                             line={"width": 3, "color": "#d62728"}), row=1, col=1)
    fig.add_trace(go.Scatter(x=bs, y=[r["table_entries"] for r in rows], mode="lines+markers", showlegend=False,
                             line={"width": 3, "color": "#1f77b4"}), row=1, col=2)
    fig.update_yaxes(type="log", tickvals=[1, 2, 5, 10, 20, 50, 100, 200], row=1, col=2)
    if measured_ms:
        ks = sorted(measured_ms)
        fig.add_trace(go.Scatter(x=ks, y=[measured_ms[k] for k in ks], mode="lines+markers", showlegend=False,
                                 line={"width": 3, "color": "#2ca02c"}), row=1, col=3)
        fig.update_yaxes(rangemode="tozero", row=1, col=3)
    for c in range(1, len(titles) + 1):
        fig.update_xaxes(type="log", title_text=tr("block size (tokens)"), tickvals=bs, row=1, col=c)
    return _layout(fig, tr("Block size trade-off"), height=430)


def sharing_figure(labels: Sequence[str], blocks_without: Sequence[int], blocks_with: Sequence[int],
                   title: str | None = None) -> go.Figure:
    """Grouped bars: physical blocks needed without sharing vs with (copy-on-write / prefix caching).

    ``title`` defaults to "KV blocks with and without sharing" (in the reader's language).
    """
    if title is None:
        title = tr("KV blocks with and without sharing")
    fig = go.Figure()
    fig.add_trace(go.Bar(x=list(labels), y=list(blocks_without), name=tr("no sharing"), marker_color="#d62728",
                         text=list(blocks_without), textposition="outside"))
    fig.add_trace(go.Bar(x=list(labels), y=list(blocks_with), name=tr("shared blocks"), marker_color="#1f77b4",
                         text=list(blocks_with), textposition="outside"))
    fig.update_layout(barmode="group", yaxis_title=tr("physical blocks"))
    return _layout(fig, title, height=420)


def prefix_cache_figure(request_ids: Sequence[str], ttft_off_ms: Sequence[float], ttft_on_ms: Sequence[float],
                        computed_off: Sequence[int], computed_on: Sequence[int]) -> go.Figure:
    """Per request: prefill tokens computed and measured TTFT, without and with prefix caching."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(tr("prefill tokens computed"), tr("TTFT (ms, measured)")),
                        horizontal_spacing=0.1)
    x = [str(r) for r in request_ids]
    for col, (off, on) in enumerate(((computed_off, computed_on), (ttft_off_ms, ttft_on_ms)), start=1):
        fig.add_trace(go.Bar(x=x, y=list(off), name=tr("prefix caching off"), marker_color="#d62728",
                             showlegend=col == 1), row=1, col=col)
        fig.add_trace(go.Bar(x=x, y=list(on), name=tr("prefix caching on"), marker_color="#1f77b4",
                             showlegend=col == 1), row=1, col=col)
        fig.update_xaxes(title_text=tr("request (arrival order)"), row=1, col=col)
    fig.update_yaxes(title_text=tr("tokens"), row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=2)
    fig.update_layout(barmode="group", legend={"orientation": "h", "y": -0.25})
    fig.update_annotations(font={"size": 16})
    return _layout(fig, tr("Prefix caching: a shared system prompt is computed once"), height=440)


def reservation_figure(report) -> go.Figure:
    """One request's contiguous reservation vs what it uses vs paged allocation.

    Args:
        report: a :class:`labsupport.serving_math.ReservationReport`.
    """
    mib = 1024 * 1024
    names = [tr("contiguous reservation"), tr("KV actually used"), tr("paged (block {size})", size=report.block_size)]
    values = [report.reserved_bytes / mib, report.used_bytes / mib, report.paged_bytes / mib]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(tr("per request (MB)"), tr("requests that fit in the KV memory")),
                        horizontal_spacing=0.15)
    fig.add_trace(go.Bar(x=names, y=values, text=[f"{v:.1f} MB" for v in values], textposition="outside",
                         marker_color=["#d62728", "#2ca02c", "#1f77b4"], showlegend=False), row=1, col=1)
    counts = [report.requests_contiguous, report.requests_exact, report.requests_paged]
    fig.add_trace(go.Bar(x=names, y=counts, text=[f"{c:,}" for c in counts], textposition="outside",
                         marker_color=["#d62728", "#2ca02c", "#1f77b4"], showlegend=False), row=1, col=2)
    fig.update_yaxes(title_text="MB", range=[0, max(values) * 1.2], row=1, col=1)
    fig.update_yaxes(title_text=tr("requests"), range=[0, max(counts) * 1.2], row=1, col=2)
    fig.update_annotations(font={"size": 16})
    return _layout(fig, tr("Reserving {reserved} tokens for a request that uses {used}",
                           reserved=report.reserved_tokens, used=report.used_tokens), height=460)
