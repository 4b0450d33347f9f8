"""Panels of the parallelism chapter: the measured pipeline runs, and the cluster cost model.

Thin wiring: sliders → :mod:`labsupport.parallel.cost_model` / measured results →
:mod:`labsupport.viz.parallel` figures. Each panel draws its first state when built; an error
in a callback is shown as a red line in the panel, which keeps working.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from ..i18n import tr
from ..parallel import cost_model as cm
from ..parallel.pipeline import bubble_fraction
from ..viz.parallel import cluster_figure, pipeline_timeline_figure
from .common import panel_choice, show_figure
from .snapshot import Panel

TP_DEGREES = [1, 2, 4, 8, 16]
PP_DEGREES = [1, 2, 4, 8]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
CONTEXTS = [512, 1024, 2048, 4096, 8192, 16384, 32768, 131072]
#: the longest context each model was trained for (Llama 3: 8k; Llama 3.1: 128k); others: no limit here
MAX_CONTEXT = {"Llama 3 8B": 8192, "Llama 3 70B": 8192, "Llama 3.1 405B": 131072}


def _error(text: str) -> str:
    return f"<div style='color:#d62728;font-size:15px'>{html.escape(text)}</div>"


def pipeline_panel(runs: dict[int, dict]) -> widgets.VBox:
    """Step through measured pipeline runs: a micro-batch slider shows that run's timeline.

    Args:
        runs: ``{m: {"events": per-stage intervals, "bubble": measured fraction}}`` for each measured ``m``.

    Raises:
        ValueError: no runs.
    """
    if not runs:
        raise ValueError("runs must hold at least one measured pipeline run")
    ms = sorted(runs)
    slider = widgets.SelectionSlider(options=ms, value=ms[0], description=tr("micro-batches m"),
                                     style={"description_width": "initial"}, continuous_update=True)
    text, chart = widgets.HTML(), widgets.Output()

    def redraw(_change=None) -> None:
        try:
            m = slider.value
            run = runs[m]
            p = len(run["events"])
            show_figure(chart, pipeline_timeline_figure(run["events"], tr("{p} stages, m = {m} micro-batches", p=p, m=m)))
            text.value = ("<div style='font-size:15px'>"
                          + tr("measured bubble <b>{bubble:.2f}</b> · GPipe's (p − 1)/(m + p − 1) = {gpipe:.2f}",
                               bubble=run["bubble"], gpipe=bubble_fraction(p, m)) + "</div>")
        except Exception as err:                                # noqa: BLE001 - shown in the panel
            text.value = _error(f"{type(err).__name__}: {err}")

    slider.observe(redraw, names="value")
    redraw()
    return Panel([slider, text, chart])


def cluster_panel(model: str = "Llama 3 70B", tp: int = 4, pp: int = 1, interconnect: str = cm.NVLINK.name,
                  batch: int = 1, context: int = 4096, calibration: dict | None = None) -> widgets.VBox:
    """Model, TP degree, PP degree, interconnect, batch and context → step time and memory per GPU.

    Args:
        model: a key of :data:`labsupport.parallel.cost_model.MODELS` (or ``calibration["name"]``).
        tp, pp: initial degrees (TP in 1, 2, 4, 8, 16; PP in 1, 2, 4, 8).
        interconnect: a key of :data:`labsupport.parallel.cost_model.LINKS` (the TP link).
        batch, context: initial decode batch and tokens per request.
        calibration: optional measured point: ``{"name", "shape", "gpu", "link", "tp", "measured_ms"}``
            (and ``"max_context"``, its ``n_positions``) — a model priced with the hardware fitted
            on this machine, its measured step times drawn as markers.

    Raises:
        ValueError: a value the sliders do not offer.
    """
    models = dict(cm.MODELS)
    links = dict(cm.LINKS)
    if calibration:
        models[calibration["name"]] = calibration["shape"]
        links[calibration["link"].name] = calibration["link"]
    for name, value, options in (("model", model, list(models)), ("tp", tp, TP_DEGREES), ("pp", pp, PP_DEGREES),
                                 ("interconnect", interconnect, list(links)), ("batch", batch, BATCHES),
                                 ("context", context, CONTEXTS)):
        panel_choice(name, value, options)
    model_w = widgets.Dropdown(options=list(models), value=model, description=tr("model"))
    link_w = widgets.Dropdown(options=list(links), value=interconnect, description=tr("TP link"),
                              layout={"width": "340px"})
    tp_w = widgets.SelectionSlider(options=TP_DEGREES, value=tp, description=tr("TP degree"))
    pp_w = widgets.SelectionSlider(options=PP_DEGREES, value=pp, description=tr("PP degree"))
    batch_w = widgets.SelectionSlider(options=BATCHES, value=batch, description=tr("batch"))
    ctx_w = widgets.SelectionSlider(options=CONTEXTS, value=context, description=tr("context"))
    text, chart = widgets.HTML(), widgets.Output()
    limits = dict(MAX_CONTEXT, **({calibration["name"]: calibration["max_context"]}
                                  if calibration and calibration.get("max_context") else {}))

    def contexts_for(name: str) -> list[int]:
        """The context slider's stops for a model: none past its context window."""
        top = limits.get(name)
        return [c for c in CONTEXTS if top is None or c <= top] or CONTEXTS[:1]

    def on_model(_change=None) -> None:
        allowed = contexts_for(model_w.value)
        if list(ctx_w.options) != allowed:
            value = ctx_w.value if ctx_w.value in allowed else allowed[-1]
            ctx_w.options = allowed                              # resets the value to the first stop …
            ctx_w.value = value                                  # … so set it after
        redraw()

    def refuse(message: str) -> None:
        """Say why a setting is refused (a red line), and show no bars of it."""
        text.value = _error(message)
        chart.outputs = ()

    def redraw(_change=None) -> None:
        try:
            shape = models[model_w.value]
            calibrated = calibration is not None and model_w.value == calibration["name"]
            gpu = calibration["gpu"] if calibrated else cm.H100
            link = links[link_w.value]
            if pp_w.value > shape.n_layers:             # one stage needs at least one layer: say so, never clamp
                refuse(tr("ValueError: PP degree {pp} needs at least {pp} layers; {model} has {layers}: "
                          "choose a PP degree of at most {layers}", pp=pp_w.value, model=shape.name,
                          layers=shape.n_layers))
                return
            pp_value = pp_w.value
            rows = [cm.decode_step(shape, t, pp_value, batch_w.value, ctx_w.value, link, gpu,
                                   weight_dtype="fp32" if calibrated else "bf16",
                                   kv_dtype="fp32" if calibrated else "fp16",
                                   **({"inter_node": link, "intra_node": link} if calibrated else {}))
                    for t in TP_DEGREES if shape.n_heads % t == 0]
            chosen = next((r for r in rows if r.tp == tp_w.value), None)
            if chosen is None:
                refuse(tr("ValueError: TP degree {tp} does not divide the {heads} heads of {model}", tp=tp_w.value,
                          heads=shape.n_heads, model=shape.name))
                return
            marks = ({"tp": calibration["tp"], "measured_ms": calibration["measured_ms"]} if calibrated else None)
            show_figure(chart, cluster_figure(rows, chosen, tr("{model} on {gpu}, PP {pp}, batch {batch}, context {context:,}",
                                                               model=shape.name, gpu=gpu.name, pp=pp_value,
                                                               batch=batch_w.value, context=ctx_w.value), marks))
            best = min((r for r in rows if r.fits), key=lambda r: r.total_s, default=None)
            text.value = "<div style='font-size:15px'>" + tr(
                "{gpus} GPU(s): step <b>{step:.2f} ms</b> (weights {weights:.2f}, KV {kv:.2f}, TP all-reduce "
                "{tp_comm:.2f} on {tp_link}, PP hops {pp_comm:.3f} on {pp_link}) · memory per GPU {memory:.1f} GB — "
                "{fits} · fastest layout that fits at this PP: {best}",
                gpus=chosen.gpus, step=chosen.total_s * 1e3, weights=chosen.weights_s * 1e3, kv=chosen.kv_s * 1e3,
                tp_comm=chosen.tp_comm_s * 1e3, tp_link=html.escape(chosen.tp_link), pp_comm=chosen.pp_comm_s * 1e3,
                pp_link=html.escape(chosen.pp_link), memory=chosen.memory_per_gpu / 1e9,
                fits=tr("fits") if chosen.fits else tr("<b>does not fit</b>"),
                best=tr("none") if best is None else f"TP {best.tp} ({best.total_s * 1e3:.2f} ms)") + "</div>"
        except Exception as err:                                # noqa: BLE001 - shown in the panel
            text.value = _error(f"{type(err).__name__}: {err}")
            chart.outputs = ()                                   # no bars of a setting that was refused

    for control in (link_w, tp_w, pp_w, batch_w, ctx_w):
        control.observe(redraw, names="value")
    model_w.observe(on_model, names="value")
    on_model()
    return Panel([widgets.HBox([model_w, link_w]), widgets.HBox([tp_w, pp_w]),
                         widgets.HBox([batch_w, ctx_w]), text, chart])
