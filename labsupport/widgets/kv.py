"""Panels of the KV-cache chapter: the cache animation (P, n, step) and the KV memory calculator.

Thin wiring of sliders → :mod:`labsupport.kv` → :mod:`labsupport.viz.kv` figures. Each panel
draws its first state when built and redraws its figures (plain plotly outputs in
``ipywidgets.Output`` s, see :func:`labsupport.widgets.common.show_figure`) on every change.
"""

from __future__ import annotations

import ipywidgets as widgets

from labsupport.widgets.snapshot import Panel

from .. import kv
from ..i18n import tr
from ..viz.kv import kv_cells_figure, kv_counts_figure, memory_figure
from .common import guarded, panel_choice, panel_int, show_figure


def kv_cache_animation(prompt_len: int = 12, new_tokens: int = 28, step: int = 4,
                       width_px: int = 940) -> widgets.VBox:
    """The classic "recompute vs reuse" animation: P and n sliders, a step slider with a play button.

    Shows the positions computed at the current step (red) for both methods, the cumulative
    counts (parabola vs line) and the saving factor.

    Args:
        prompt_len: initial P (slider 1–48).
        new_tokens: initial n (slider 1–64).
        step: initial step (0 … ``new_tokens``).
        width_px: width of the figures in pixels.

    Returns:
        A ``VBox`` of the controls, a numbers line and two ``Output`` s showing the figures.

    Raises:
        TypeError: a starting value not an integer.
        ValueError: ``prompt_len``, ``new_tokens`` or ``step`` outside the slider ranges
            (1–48, 1–64, 0–``new_tokens``).
    """
    panel_int("prompt_len", prompt_len, 1, 48)
    panel_int("new_tokens", new_tokens, 1, 64)
    start = panel_int("step", step, 0, new_tokens)
    panel_int("width_px", width_px, 200, 4000)
    P = widgets.IntSlider(value=prompt_len, min=1, max=48, description=tr("prompt P"), continuous_update=False)
    n = widgets.IntSlider(value=new_tokens, min=1, max=64, description=tr("new tokens n"), continuous_update=False,
                          style={"description_width": "initial"})
    step_w = widgets.IntSlider(value=start, min=0, max=new_tokens, description=tr("step"), continuous_update=True)
    play = widgets.Play(value=start, min=0, max=new_tokens, interval=400, description=tr("play"))
    widgets.jslink((play, "value"), (step_w, "value"))
    numbers = widgets.HTML()

    def figures():
        t = min(step_w.value, n.value)
        return (kv_cells_figure(P.value, n.value, t).update_layout(width=width_px),
                kv_counts_figure(P.value, n.value, t).update_layout(width=width_px))

    cells, counts = widgets.Output(), widgets.Output()
    first_cells, first_counts = figures()
    show_figure(cells, first_cells)
    show_figure(counts, first_counts)

    def text() -> str:
        p, t, m = P.value, min(step_w.value, n.value), n.value
        none_now, cache_now = kv.kv_step_cells(p, t, False)[1], kv.kv_step_cells(p, t, True)[1]
        none_all, cache_all = kv.kv_positions_computed(p, t, False), kv.kv_positions_computed(p, t, True)
        return ("<div style='font-size:15px'>"
                + tr("step {t}: this step {none_now} (no cache) / {cache_now} (cache) · so far {none_all:,} / "
                     "{cache_all:,} · saving <b>{saving:.2f}×</b> (at n = {n}: {final:.2f}×)",
                     t=t, none_now=none_now, cache_now=cache_now, none_all=none_all, cache_all=cache_all,
                     saving=none_all / cache_all, n=m, final=kv.kv_saving(p, m))
                + "</div>")

    numbers.value = text()
    error = widgets.HTML()

    @guarded(lambda msg: setattr(error, "value", msg))
    def redraw(_change=None):
        step_w.max = play.max = n.value
        new_cells, new_counts = figures()
        show_figure(cells, new_cells)
        show_figure(counts, new_counts)
        numbers.value = text()

    for control in (P, n, step_w):
        control.observe(redraw, names="value")
    box = Panel([widgets.HBox([P, n]), widgets.HBox([play, step_w]), numbers, cells, counts, error])
    box.error = error
    return box


SEQ_LENS = [2 ** k for k in range(7, 18)]            # 128 … 131,072 tokens
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def kv_memory_calculator(preset: str = "Llama 3 8B", seq_len: int = 8192, batch: int = 1,
                         kv_dtype: str = "fp16", extra_presets: dict[str, kv.ModelShape] | None = None,
                         width_px: int = 940) -> widgets.VBox:
    """The KV memory calculator: preset, attention type, KV precision, sequence length, batch.

    Args:
        preset: initial model (a key of :data:`labsupport.kv.PRESETS` or of ``extra_presets``).
        seq_len: initial sequence length (a power of two, 128 … 131,072).
        batch: initial batch (1 … 256, powers of two).
        kv_dtype: initial KV precision (a key of :data:`labsupport.kv.DTYPE_BITS`).
        extra_presets: more models, e.g. ``{"tiny-gpt2": kv.preset("tiny-gpt2")}``.
        width_px: width of the chart in pixels.

    Returns:
        A ``VBox`` with the controls, a summary and the bar chart (an ``Output``).

    Raises:
        ValueError: an unknown preset or KV precision, a length or batch not offered by the sliders.
    """
    panel_choice("kv_dtype", kv_dtype, kv.DTYPE_BITS)
    shapes = dict(kv.PRESETS, **(extra_presets or {}))
    panel_choice("preset", preset, sorted(shapes))
    panel_choice("seq_len", seq_len, SEQ_LENS)
    panel_choice("batch", batch, BATCHES)
    panel_int("width_px", width_px, 200, 4000)
    model = widgets.Dropdown(options=list(shapes), value=preset, description=tr("preset"))
    attention = widgets.ToggleButtons(options=list(kv.ATTENTION_KINDS), value=shapes[preset].attention,
                                      description=tr("attention"))
    precision = widgets.ToggleButtons(options=list(kv.DTYPE_BITS), value=kv_dtype, description=tr("KV precision"),
                                      style={"description_width": "initial"})
    length = widgets.SelectionSlider(options=[(f"{s:,}", s) for s in SEQ_LENS], value=seq_len,
                                     description=tr("sequence s"), continuous_update=False,
                                     style={"description_width": "initial"})
    batch_w = widgets.SelectionSlider(options=BATCHES, value=batch, description=tr("batch b"), continuous_update=False)
    summary = widgets.HTML()

    def build():
        shape = shapes[model.value]
        chosen = shape.with_attention(attention.value)
        budget = kv.memory_budget(chosen, length.value, batch_w.value, precision.value)
        fig = memory_figure(shape, length.value, batch_w.value, precision.value, attention.value)
        fig.update_layout(width=width_px)
        fields = {"L": chosen.n_layers, "H_kv": chosen.n_kv_heads, "d_head": chosen.head_dim,
                  "per_token": kv.format_bytes(budget.kv_per_token), "kv": kv.format_bytes(budget.kv),
                  "total": budget.total / 1e9, "ratio": budget.kv_over_weights}
        if budget.fits:
            line = tr("structure (L / H_kv / d_head): {L} / {H_kv} / {d_head} · KV per token: <b>{per_token}</b> · "
                      "KV cache: <b>{kv}</b> · weights + KV: {total:.1f} GB (fits in 80 GB) · "
                      "KV / weights = {ratio:.2f}", **fields)
        else:
            line = tr("structure (L / H_kv / d_head): {L} / {H_kv} / {d_head} · KV per token: <b>{per_token}</b> · "
                      "KV cache: <b>{kv}</b> · weights + KV: {total:.1f} GB (does not fit in 80 GB) · "
                      "KV / weights = {ratio:.2f}", **fields)
        text = f"<div style='font-size:15px'>{line}</div>"
        return fig, text

    chart = widgets.Output()
    fig, summary.value = build()
    show_figure(chart, fig)

    error = widgets.HTML()

    @guarded(lambda msg: setattr(error, "value", msg))
    def redraw(change=None):
        if change is not None and change["owner"] is model:
            attention.value = shapes[model.value].attention      # triggers one more redraw; harmless
        new_fig, summary.value = build()
        show_figure(chart, new_fig)

    for control in (model, attention, precision, length, batch_w):
        control.observe(redraw, names="value")
    box = Panel([widgets.HBox([model, attention]), precision, widgets.HBox([length, batch_w]), summary, chart, error])
    box.error = error
    return box
