"""Panels of the PagedAttention chapter: thin wiring of sliders → simulator / engine history → figures."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import ipywidgets as W
import plotly.graph_objects as go

from labsupport.widgets.snapshot import Panel

from ..i18n import tr
from ..sim.fragmentation import Workload, compare
from ..viz.paged import (
    _counters_text,
    _grid_title,
    block_table_figure,
    fragmentation_counters_figure,
    fragmentation_figure,
    memory_image,
)
from .common import FigureOutput, guarded, panel_choice, panel_int, show_figure

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def _counters(run, step: int) -> dict:
    return {"running": int(run.running[step]), "queued": int(run.queued[step]),
            "waste": float(run.waste[step]), "completed": int(run.completed[step])}


def _series(runs) -> dict:
    return {name: {"running": r.running, "queued": r.queued, "waste": r.waste, "completed": r.completed}
            for name, r in runs.items()}


def _table_text(run, step: int, first: int = 4) -> str:
    tables = run.block_tables[step]
    def short(table: list[int], keep: int = 10) -> str:
        shown = ", ".join(str(b) for b in table[:keep])
        return tr("[{shown}, … ({n} blocks)]", shown=shown, n=len(table)) if len(table) > keep else f"[{shown}]"

    rows = [f"<tr><td>{tr('request {rid}', rid=rid)}&nbsp;</td><td>{short(table)}</td></tr>"
            for rid, table in list(tables.items())[:first]]
    body = "".join(rows) or f"<tr><td colspan=2>{tr('no running request')}</td></tr>"
    heading = tr("Paged side, block tables of the first {first} running requests (step {step})", first=first, step=step)
    return f"<b>{heading}</b><table style='font-size:15px'>{body}</table>"


def fragmentation_lab(workload: Workload | None = None, block_size: int = 16) -> W.VBox:
    """The fragmentation simulator: contiguous vs paged on one request stream.

    Sliders: reservation length, block size, arrival rate (each re-runs
    :func:`labsupport.sim.fragmentation.compare`, ~0.2 s) and the step shown (with a play
    button). The paged side uses the engine's :class:`~labsupport.engine.BlockManager`.

    Returns:
        a ``VBox`` that already shows step 0 of the default run.

    Raises:
        TypeError: ``workload`` not a :class:`Workload`.
        ValueError: ``block_size`` not one of the slider's sizes (1, 2, 4, … 128).
    """
    wl = workload or Workload()
    if not isinstance(wl, Workload):
        raise TypeError(f"workload must be a Workload or None, got {type(workload).__name__}")
    panel_choice("block_size", block_size, BLOCK_SIZES)
    state = {"runs": compare(wl, block_size)}
    reservation = W.IntSlider(value=wl.reservation, min=64, max=wl.memory_tokens, step=32,
                              description=tr("reservation"), continuous_update=False)
    bsize = W.SelectionSlider(options=list(BLOCK_SIZES), value=block_size, description=tr("block size"),
                              continuous_update=False)
    rate = W.FloatSlider(value=wl.arrival_rate, min=0.05, max=1.5, step=0.05, description=tr("arrivals/step"),
                         continuous_update=False)
    step = W.IntSlider(value=wl.num_steps // 2, min=0, max=wl.num_steps - 1, description=tr("step"))
    play = W.Play(value=step.value, min=0, max=wl.num_steps - 1, interval=150, description=tr("play"))
    W.jslink((play, "value"), (step, "value"))
    for s in (reservation, bsize, rate, step):
        s.style.description_width = "110px"
        s.layout.width = "420px"

    def grids(k: int) -> dict:
        return {n: (r.owner[k], r.used[k]) for n, r in state["runs"].items()}

    def counters(k: int) -> dict:
        return {n: _counters(r, k) for n, r in state["runs"].items()}

    def figure(k: int) -> go.Figure:
        return fragmentation_figure(grids(k), counters(k), k,
                                    block_sizes={n: r.block_size for n, r in state["runs"].items()})

    # Built once per run; a step only changes the grids' cells and texts and the step marker, then
    # redraws (building the figures anew costs ~0.3 s, longer than the play button's 150 ms tick).
    state["grid"], state["line"] = figure(step.value), fragmentation_counters_figure(_series(state["runs"]), step.value)
    grid_fig, line_fig = FigureOutput(state["grid"]), FigureOutput(state["line"])
    table = W.HTML(_table_text(state["runs"]["paged"], step.value))

    def redraw_step(k: int) -> None:
        grid, line = state["grid"], state["line"]
        for i, (name, run) in enumerate(state["runs"].items()):
            img, text = memory_image(run.owner[k], run.used[k])
            grid.data[i].z, grid.data[i].text = img, text
            grid.layout.annotations[i].text = _counters_text(name, _counters(run, k))
        grid.layout.title.text = _grid_title(k)
        for shape in line.layout.shapes:
            shape.x0 = shape.x1 = k
        grid_fig.show(grid)
        line_fig.show(line)
        table.value = _table_text(state["runs"]["paged"], k)

    error = W.HTML()
    report = guarded(lambda msg: setattr(error, "value", msg))

    @report
    def rerun(_=None) -> None:
        w = Workload(reservation=reservation.value, arrival_rate=rate.value, num_steps=wl.num_steps,
                     memory_tokens=wl.memory_tokens, prompt_len=wl.prompt_len,
                     tokens_per_step=wl.tokens_per_step, seed=wl.seed)
        state["runs"] = compare(w, bsize.value)
        state["grid"] = figure(step.value)
        state["line"] = fragmentation_counters_figure(_series(state["runs"]), step.value)
        redraw_step(step.value)

    reservation.observe(rerun, "value")
    bsize.observe(rerun, "value")
    rate.observe(rerun, "value")
    step.observe(report(lambda ch: redraw_step(ch["new"])), "value")
    table.layout.width = "500px"
    step.layout.width = "380px"
    controls = W.HBox([W.VBox([reservation, bsize, rate], layout=W.Layout(min_width="430px")),
                       W.VBox([W.HBox([play, step]), table])])
    box = Panel([controls, grid_fig, line_fig, error])
    box.error = error
    return box


def block_table_stepper(frames: Sequence[dict], num_blocks: int, block_size: int,
                        describe: Callable[[dict], str] | None = None, title: str | None = None,
                        start: int | None = None) -> W.VBox:
    """Step through recorded engine states and watch block tables change.

    Args:
        frames: one dict per engine step with ``block_tables`` ({request: [blocks]}),
            ``ref_counts`` (per block), ``num_slots`` ({request: tokens holding a slot}), ``cached_blocks``
            (list) and ``label`` (str) — see the chapter for how they come from
            ``LLMEngine.history``.
        num_blocks, block_size: the engine's pool.
        describe: optional ``frame → HTML`` shown above the figure.
        title: figure title prefix (default: "Block tables", in the reader's language).
        start: the frame shown first (default: the one holding the most blocks).

    Returns:
        a ``VBox`` (slider, info, an ``Output`` showing the figure) showing frame ``start``;
        the slider's value is the frame index, its readout the frame's label.

    Raises:
        ValueError: no frames, or ``start`` not a frame index.
    """
    if not frames:
        raise ValueError("frames must hold at least one recorded step, got none")
    if title is None:
        title = tr("Block tables")

    ids: list = []
    for f in frames:
        ids += [rid for rid in f["block_tables"] if rid not in ids]

    def figure(k: int) -> go.Figure:
        f = frames[k]
        return block_table_figure(f["block_tables"], num_blocks, ref_counts=f.get("ref_counts"),
                                  num_tokens=f.get("num_slots"), block_size=block_size,
                                  cached_blocks=f.get("cached_blocks", ()), title=f"{title} — {f['label']}",
                                  request_ids=ids)

    if start is not None:
        panel_int("start", start, 0, len(frames) - 1)
    k0 = start if start is not None else max(range(len(frames)),
                                             key=lambda k: sum(len(t) for t in frames[k]["block_tables"].values()))
    # A plain plotly output redrawn on every move (not a FigureWidget updated in place: in
    # JupyterLab 4 that one could stay blank, axes without data or title).
    out = W.Output()
    show_figure(out, figure(k0))
    info = W.HTML(describe(frames[k0]) if describe else "")
    # The slider's readout is the frame's label ("step 9"), so it always agrees with the title.
    labels = [str(f["label"]) for f in frames]
    if len(set(labels)) < len(labels):
        labels = [f"{lab} ({k})" for k, lab in enumerate(labels)]
    slider = W.SelectionSlider(options=list(zip(labels, range(len(frames)))), value=k0, description=tr("engine"),
                               continuous_update=False)
    slider.layout.width = "500px"

    error = W.HTML()

    @guarded(lambda msg: setattr(error, "value", msg))
    def redraw(change) -> None:
        k = change["new"]
        show_figure(out, figure(k))
        if describe:
            info.value = describe(frames[k])

    slider.observe(redraw, "value")
    box = Panel([slider, info, out, error])
    box.error = error
    return box
