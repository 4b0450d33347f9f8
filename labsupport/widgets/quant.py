"""The quantisation lab: format, scale granularity, group size (moving it selects per-group scales),
method and which matrices →
per-matrix error, perplexity and top-1 agreement with fp32, bytes, and the predicted step time.

Thin wiring: :func:`labsupport.quant.quantize_model` and :func:`~labsupport.quant.score` do the
work, :func:`labsupport.viz.quant.matrix_error_figure` draws. Results are cached per setting, so
going back to a setting is instant.
"""

from __future__ import annotations

import ipywidgets as widgets
import torch

from ..i18n import tr
from ..quant import FORMATS, GRANULARITIES, TARGETS, number_format, quantize_model, score, top1_agreement
from ..validation import check_int, check_real, check_type
from ..viz.quant import matrix_error_figure
from .common import FigureOutput, error_html, guarded, panel_choice
from .snapshot import Panel

GROUP_SIZES = (32, 64, 128, 256)


def quant_lab(lm, eval_ids: torch.Tensor, *, bandwidth: float, calibration_ids: torch.Tensor | None = None,
              fmt: str = "int4", granularity: str = "group", group_size: int = 128,
              targets: tuple[str, ...] = ("attn", "mlp"), width_px: int = 950) -> widgets.VBox:
    """The panel.

    Args:
        lm: the fp32 model. eval_ids: ``(N,)`` held-out token ids for perplexity.
        bandwidth: bytes/s of this machine's weight stream (the chapter measures it), for the
            predicted step time ``bytes / bandwidth``.
        calibration_ids: training-split ids for AWQ (without them the method buttons offer RTN only).
        fmt, granularity, group_size, targets: the starting setting.

    Raises:
        TypeError / ValueError: a starting value the panel does not offer, a bandwidth ≤ 0.
    """
    check_type("eval_ids", eval_ids, torch.Tensor)
    if calibration_ids is not None:
        check_type("calibration_ids", calibration_ids, torch.Tensor)
    check_real("bandwidth", bandwidth, 0, low_open=True)
    check_int("width_px", width_px, 200, 4000)
    panel_choice("fmt", fmt, FORMATS)
    panel_choice("granularity", granularity, GRANULARITIES)
    panel_choice("group_size", group_size, GROUP_SIZES)
    for t in targets:
        panel_choice("targets", t, TARGETS)
    methods = ["rtn", "awq"] if calibration_ids is not None else ["rtn"]
    fmt_w = widgets.ToggleButtons(options=list(FORMATS), value=fmt, description=tr("format"),
                                  style={"button_width": "100px"})
    grains = {"tensor": tr("tensor"), "channel": tr("channel"), "group": tr("group")}      # value → label shown
    gran_w = widgets.ToggleButtons(options=[(grains.get(g, g), g) for g in GRANULARITIES], value=granularity,
                                   description=tr("scale per"))
    group_w = widgets.SelectionSlider(options=list(GROUP_SIZES), value=group_size, description=tr("group size"),
                                      continuous_update=False, style={"description_width": "initial"})
    method_w = widgets.ToggleButtons(options=methods, value="rtn", description=tr("method"))
    target_ws = {t: widgets.Checkbox(value=t in targets, description=t, indent=False,
                                     layout=widgets.Layout(width="110px")) for t in TARGETS}
    readout, error = widgets.HTML(), widgets.HTML()
    chart = FigureOutput(width=width_px)
    reference = score(lm, eval_ids)
    fp32_bytes = quantize_model(lm, "fp32", granularity="tensor").fp32_bytes
    cache: dict[tuple, tuple] = {}

    def evaluate(key):
        if key not in cache:
            f, g, size, chosen, method = key
            q = quantize_model(lm, f, granularity=g, group_size=size, targets=chosen, method=method,
                               calibration_ids=calibration_ids if method == "awq" else None)
            s = score(q.lm, eval_ids)
            cache[key] = (q, s.perplexity, top1_agreement(reference, s))
        return cache[key]

    def redraw(_change=None):
        if not any(target_ws[t].value for t in TARGETS):      # nothing left to quantise: say so (a red line)
            error.value = error_html(tr("tick at least one of attn / mlp / lm_head to quantise"))
            return
        _redraw()

    @guarded(lambda msg: setattr(error, "value", msg))
    def _redraw():
        chosen = tuple(t for t in TARGETS if target_ws[t].value)
        scaled = number_format(fmt_w.value).scaled                # fp32 / bf16 / fp16 are a cast: no scale
        for w in (gran_w, group_w, method_w):
            w.disabled = not scaled
        key = (fmt_w.value, gran_w.value, group_w.value, chosen, method_w.value) if scaled else \
            (fmt_w.value, "tensor", 0, chosen, "rtn")
        q, ppl, agree = evaluate(key)
        step_fp32, step_q = fp32_bytes / bandwidth, q.model_bytes / bandwidth
        readout.value = "<div style='font-size:16px'>" + tr(
            "perplexity <b>{ppl:.2f}</b> (fp32 {ref:.2f}, {change:+.1f} %) · top-1 agreement with fp32 "
            "<b>{agree:.1f} %</b> · model <b>{mb:.1f} MB</b> (fp32 {fp32_mb:.1f} MB) · predicted step "
            "{step:.2f} ms vs {fp32_step:.2f} ms ({ratio:.2f}× at {gbs:.1f} GB/s, weights only)",
            ppl=ppl, ref=reference.perplexity, change=100 * (ppl / reference.perplexity - 1), agree=100 * agree,
            mb=q.model_bytes / 1e6, fp32_mb=fp32_bytes / 1e6, step=1e3 * step_q, fp32_step=1e3 * step_fp32,
            ratio=step_fp32 / step_q, gbs=bandwidth / 1e9) + "</div>"
        label = (tr("per group of {size}", size=group_w.value) if gran_w.value == "group" else
                 tr("per tensor") if gran_w.value == "tensor" else tr("per channel"))
        if not scaled:
            title = (tr("{fmt}: a cast, no scale — no rounding error at all", fmt=fmt_w.value) if fmt_w.value == "fp32"
                     else tr("{fmt}: a cast, no scale: the mantissa's rounding", fmt=fmt_w.value))
        else:
            title = tr("{fmt}, {scale}, {method}: error of each matrix", fmt=fmt_w.value, scale=label,
                       method=method_w.value)
        chart.show(matrix_error_figure(q.errors, title))

    def group_moved(_change):                   # moving the group size means scaling per group
        if gran_w.value != "group" and not gran_w.disabled:
            gran_w.value = "group"                  # (this redraws)
        else:
            redraw()

    for w in (fmt_w, gran_w, method_w, *target_ws.values()):
        w.observe(redraw, names="value")
    group_w.observe(group_moved, names="value")
    redraw()
    box = Panel([fmt_w, widgets.HBox([gran_w, group_w]), widgets.HBox([method_w, *target_ws.values()]),
                 readout, chart, error])
    box.error = error
    return box
