"""Figures of the KV-cache chapter: recompute vs cache, the cache growing, memory, and the step-time model.

Pure functions ``data → go.Figure``; each builder always emits the same traces in the same
order, so a panel can update a ``go.FigureWidget`` in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import kv
from ..i18n import tr
from ..validation import check_int
from .style import FONT

RED, BLUE, GREY, GREEN = "#d62728", "#1f77b4", "#d9d9d9", "#2ca02c"


def kv_counts_figure(prompt_len: int, new_tokens: int, step: int | None = None) -> go.Figure:
    """Cumulative K,V positions computed vs generated tokens: a parabola without a cache, a line with one.

    Counted by :func:`labsupport.kv.kv_positions_computed`.

    Args:
        prompt_len: P ≥ 1.
        new_tokens: n ≥ 1 (x axis 0 … n).
        step: mark this step (default ``n``).

    Raises:
        TypeError: P, n or ``step`` not an integer.
        ValueError: P or n < 1, or ``step`` outside ``[0, n]``.
    """
    check_int("prompt_len", prompt_len, 1)
    check_int("new_tokens", new_tokens, 1)
    step = new_tokens if step is None else step
    check_int("step", step, 0, new_tokens)
    xs = list(range(new_tokens + 1))
    none = [kv.kv_positions_computed(prompt_len, t, False) for t in xs]
    cache = [kv.kv_positions_computed(prompt_len, t, True) for t in xs]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=none, mode="lines", name=tr("no cache (O(n²))"), line={"color": RED, "width": 3}))
    fig.add_trace(go.Scatter(x=xs, y=cache, mode="lines", name=tr("KV cache (O(n))"), line={"color": BLUE, "width": 3}))
    fig.add_trace(go.Scatter(x=[step, step], y=[none[step], cache[step]], mode="markers+text",
                             text=[f"{none[step]:,}", f"{cache[step]:,}"], textposition="top left",
                             textfont={"size": 14}, marker={"size": 12, "color": [RED, BLUE]}, showlegend=False))
    ratio = none[step] / cache[step]
    if step == 1:
        title = tr("Positions computed, P = {P}: {ratio:.2f}× fewer with the cache after {step} step",
                   P=prompt_len, ratio=ratio, step=step)
    else:
        title = tr("Positions computed, P = {P}: {ratio:.2f}× fewer with the cache after {step} steps",
                   P=prompt_len, ratio=ratio, step=step)
    fig.update_layout(title={"text": title, "font": {"size": 17}},
                      font=FONT, template="plotly_white", height=400, legend={"x": 0.02, "y": 0.98})
    fig.update_xaxes(title=tr("decode steps (generated tokens)"), tick0=0, dtick=max(1, -(-new_tokens // 8)),
                     rangemode="tozero")
    fig.update_yaxes(title=tr("cumulative positions computed"), range=[0, none[-1] * 1.15])
    return fig


def kv_cells_figure(prompt_len: int, new_tokens: int, step: int) -> go.Figure:
    """The KV-cache animation at one step: one square per position, one row per method.

    Red = computed in this step, blue = read from the cache (reused), grey = not yet generated.

    Raises:
        TypeError: P, n or ``step`` not an integer.
        ValueError: P or n < 1, or ``step`` outside ``[0, n]``.
    """
    check_int("prompt_len", prompt_len, 1)
    check_int("new_tokens", new_tokens, 1)
    check_int("step", step, 0, new_tokens)
    total = prompt_len + new_tokens
    size = max(5, min(20, int(900 / total)))
    fig = go.Figure()
    groups = {"computed this step": ([], [], RED), "reused from the cache": ([], [], BLUE),
              "not generated yet": ([], [], GREY)}
    for row, use_cache in ((1, False), (0, True)):
        length, computed = kv.kv_step_cells(prompt_len, step, use_cache)
        for pos in range(total):
            if pos >= length:
                key = "not generated yet"
            elif pos >= length - computed:
                key = "computed this step"
            else:
                key = "reused from the cache"
            groups[key][0].append(pos)
            groups[key][1].append(row)
    names = {"computed this step": tr("computed this step"), "reused from the cache": tr("reused from the cache"),
             "not generated yet": tr("not generated yet")}
    for key, (xs, ys, colour) in groups.items():
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=names[key], hoverinfo="x",
                                 marker={"symbol": "square", "size": size, "color": colour, "line": {"width": 0}}))
    this_none = kv.kv_step_cells(prompt_len, step, False)[1]
    this_cache = kv.kv_step_cells(prompt_len, step, True)[1]
    label = tr("prefill") if step == 0 else tr("decode step {step}", step=step)
    fig.add_vline(x=prompt_len - 0.5, line={"dash": "dot", "color": "#555555"})
    def positions(n: int) -> str:
        return tr("{n} position", n=n) if n == 1 else tr("{n} positions", n=n)

    title = tr("{label}: {without} computed without a cache, {with_cache} with it",
               label=label, without=positions(this_none), with_cache=positions(this_cache))
    fig.update_layout(title={"text": title, "font": {"size": 17}},
                      font=FONT, template="plotly_white", height=300, margin={"l": 110, "t": 60, "b": 50},
                      legend={"orientation": "h", "y": -0.55, "yanchor": "top"})   # below the axis title
    fig.update_yaxes(tickvals=[0, 1], ticktext=[tr("KV cache"), tr("no cache")], range=[-0.7, 1.7])
    fig.update_xaxes(title=tr("position (prompt | generated)"), range=[-1, total])
    return fig


def timing_figure(new_tokens: Sequence[int], seconds_uncached: Sequence[float],
                  seconds_cached: Sequence[float]) -> go.Figure:
    """Measured wall-clock time of a whole generation vs new tokens, with and without the cache.

    Raises:
        ValueError: sequences of different lengths or empty.
    """
    if not new_tokens or not len(new_tokens) == len(seconds_uncached) == len(seconds_cached):
        raise ValueError("new_tokens, seconds_uncached and seconds_cached must be non-empty and of equal length")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(new_tokens), y=list(seconds_uncached), mode="lines+markers", name=tr("no cache"),
                             line={"color": RED, "width": 3}, marker={"size": 10}))
    fig.add_trace(go.Scatter(x=list(new_tokens), y=list(seconds_cached), mode="lines+markers", name=tr("KV cache"),
                             line={"color": BLUE, "width": 3}, marker={"size": 10}))
    fig.update_layout(title={"text": tr("Measured: whole-generation time vs new tokens (this machine)"),
                                 "font": {"size": 17}}, font=FONT, template="plotly_white", height=400,
                      legend={"x": 0.02, "y": 0.98})
    fig.update_xaxes(title=tr("new tokens n"))
    fig.update_yaxes(title=tr("seconds"))
    return fig


def request_timeline_figure(token_times: Sequence[float], prefill_tokens: int) -> go.Figure:
    """One request on a time axis: the prefill until the first token (TTFT),
    then one token every TPOT.

    Args:
        token_times: seconds from the request's start at which each output token appeared.
        prefill_tokens: prompt length (for the label).

    Raises:
        ValueError: no token times.
    """
    if not token_times:
        raise ValueError("token_times must hold at least one time, got none")
    ms = [t * 1e3 for t in token_times]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, ms[0]], y=[0, 0], mode="lines", name=tr("prefill of {n} tokens (TTFT)", n=prefill_tokens),
                             line={"color": RED, "width": 18}))
    fig.add_trace(go.Scatter(x=ms, y=[0] * len(ms), mode="markers", name=tr("output tokens"),
                             marker={"symbol": "line-ns", "size": 26, "line": {"width": 2, "color": BLUE}}))
    tpot = (ms[-1] - ms[0]) / (len(ms) - 1) if len(ms) > 1 else 0.0
    title = tr("One request: TTFT {ttft:.1f} ms, then a token every ≈ {tpot:.2f} ms (TPOT)", ttft=ms[0], tpot=tpot)
    fig.update_layout(title={"text": title,
                                 "font": {"size": 17}}, font=FONT, template="plotly_white", height=240,
                      legend={"orientation": "h", "y": -0.6}, margin={"t": 60, "b": 40})
    fig.update_xaxes(title=tr("milliseconds since the request arrived"), rangemode="tozero")
    fig.update_yaxes(visible=False, range=[-1, 1])
    return fig


def memory_figure(shape: kv.ModelShape, seq_len: int, batch: int = 1, kv_dtype: str = "fp16",
                  attention: str | None = None, capacity: float = 80e9) -> go.Figure:
    """A KV memory calculator: weights (bf16) + KV for MHA / GQA / MQA vs an 80 GB line.

    The chosen attention kind (default: the model's own) is drawn solid, the other two faded.

    Raises:
        ValueError: as :func:`labsupport.kv.memory_budget`, or an unknown attention kind.
    """
    chosen = attention or shape.attention
    if chosen not in kv.ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {kv.ATTENTION_KINDS}, got {attention!r}")
    kinds = list(kv.ATTENTION_KINDS)[::-1]
    budgets = [kv.memory_budget(shape.with_attention(k), seq_len, batch, kv_dtype, capacity=capacity) for k in kinds]
    labels = [f"{k} (H_kv={shape.with_attention(k).n_kv_heads})" for k in kinds]
    opacity = [1.0 if k == chosen else 0.35 for k in kinds]
    fig = go.Figure()
    fig.add_trace(go.Bar(y=labels, x=[b.weights / 1e9 for b in budgets], orientation="h", name=tr("weights (bf16)"),
                         marker={"color": "#7f7f7f", "opacity": opacity}))
    fig.add_trace(go.Bar(y=labels, x=[b.kv / 1e9 for b in budgets], orientation="h", name=tr("KV cache ({dtype})", dtype=kv_dtype),
                         marker={"color": BLUE, "opacity": opacity},
                         text=[kv.format_bytes(b.kv) for b in budgets], textposition="outside",
                         textfont={"size": 14}))
    fig.add_vline(x=capacity / 1e9, line={"dash": "dash", "color": RED, "width": 2},
                  annotation_text=tr("{gb:.0f} GB (one H100)", gb=capacity / 1e9), annotation_position="top",
                  annotation_font={"size": 14, "color": RED})
    top = max(b.total for b in budgets) / 1e9
    sel = budgets[kinds.index(chosen)]
    fig.update_layout(barmode="stack", font=FONT, template="plotly_white", height=330,
                      title={"text": tr("{model}, s = {s:,}, b = {b}: {per_token}/token, weights + KV = {gb:.1f} GB",
                                        model=shape.name, s=seq_len, b=batch,
                                        per_token=kv.format_bytes(sel.kv_per_token), gb=sel.total / 1e9),
                             "font": {"size": 17}},
                      legend={"orientation": "h", "y": -0.3}, margin={"l": 150, "t": 70})
    fig.update_xaxes(title=tr("GB (10⁹ bytes)"), range=[0, max(top, capacity / 1e9) * 1.18])
    return fig


def step_time_figure(weight_bytes: float, kv_bytes_per_request: float, bandwidth: float,
                     batches: Sequence[int] = tuple(range(1, 257)), marked: Sequence[int] = (1, 64, 240)) -> go.Figure:
    """Step time ``t(B) = (W + B·K)/BW`` and throughput ``B/t(B)`` vs batch, with the ceiling ``BW/K``.

    Raises:
        ValueError: as :func:`labsupport.kv.step_time`.
    """
    times = [kv.step_time(weight_bytes, bandwidth, b, kv_bytes_per_request) * 1e3 for b in batches]
    rates = [kv.decode_throughput(weight_bytes, bandwidth, b, kv_bytes_per_request) for b in batches]
    ceiling = kv.throughput_ceiling(kv_bytes_per_request, bandwidth)
    fig = make_subplots(rows=1, cols=2, subplot_titles=(tr("step time t(B)"), tr("throughput B / t(B)")))
    fig.add_trace(go.Scatter(x=list(batches), y=times, mode="lines", name="t(B) ms", line={"color": RED, "width": 3}),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=list(batches), y=rates, mode="lines", name=tr("tokens/s"), line={"color": BLUE, "width": 3}),
                  row=1, col=2)
    fig.add_trace(go.Scatter(x=[batches[0], batches[-1]], y=[ceiling, ceiling], mode="lines",
                             name=tr("ceiling BW/K = {ceiling:,.0f} tokens/s", ceiling=ceiling), line={"color": "#555555", "dash": "dash"}),
                  row=1, col=2)
    mt = [kv.step_time(weight_bytes, bandwidth, b, kv_bytes_per_request) * 1e3 for b in marked]
    mr = [kv.decode_throughput(weight_bytes, bandwidth, b, kv_bytes_per_request) for b in marked]
    fig.add_trace(go.Scatter(x=list(marked), y=mt, mode="markers+text", text=[f"{t:.1f} ms" for t in mt],
                             textposition=["middle right"] + ["top left"] * (len(marked) - 1), textfont={"size": 14}, marker={"size": 11, "color": RED},
                             showlegend=False), row=1, col=1)
    fig.add_trace(go.Scatter(x=list(marked), y=mr, mode="markers+text", text=[f"{r:,.0f}" for r in mr],
                             textposition=["middle right"] + ["bottom left"] * (len(marked) - 1), textfont={"size": 14}, marker={"size": 11, "color": BLUE},
                             showlegend=False), row=1, col=2)
    fig.update_layout(font=FONT, template="plotly_white", height=420,
                      title={"text": tr("t(B) = (W + B·K)/BW with W = {W:g} GB, K = {K:g} GB, BW = {BW:g} TB/s",
                                        W=weight_bytes / 1e9, K=kv_bytes_per_request / 1e9, BW=bandwidth / 1e12),
                                 "font": {"size": 17}},
                      legend={"orientation": "h", "y": -0.25})
    fig.update_annotations(font_size=15)
    fig.update_xaxes(title=tr("batch B (requests)"))
    fig.update_yaxes(title=tr("ms per step"), rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title=tr("tokens/s"), rangemode="tozero", range=[0, ceiling * 1.1], row=1, col=2)
    return fig
