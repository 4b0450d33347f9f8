"""The batch-mix lab: number format, engine mode and batch size → one request's logit change in a
batch of random others, row by row, and whether its greedy tokens stay the same.

Thin wiring: :func:`labsupport.reproducibility.batch_variance` runs the real :class:`ModelRunner`;
:func:`labsupport.viz.reproducibility.batch_variance_figure` draws. Runners are made once per setting.
"""

from __future__ import annotations

import ipywidgets as widgets

from ..engine import ModelRunner
from ..i18n import tr
from ..reproducibility import DTYPES, batch_variance, in_dtype
from ..validation import check_int, check_token_ids
from ..viz.reproducibility import batch_variance_figure
from .common import FigureOutput, guarded, panel_choice, panel_int
from .snapshot import Panel

BATCH_SIZES = (1, 2, 3, 4, 8, 16, 32)
MODES = ("default", "batch-invariant")


def batch_lab(lm, prompt, *, dtype: str = "float32", mode: str = "default", batch_size: int = 8,
              trials: int = 3, width_px: int = 950) -> Panel:
    """The panel.

    Args:
        lm: the fp32 model. prompt: the request (text, or token ids).
        dtype, mode, batch_size: the starting setting (``dtype`` one of ``float32`` / ``bfloat16`` /
            ``float16``; ``mode`` ``"default"`` or ``"batch-invariant"``; ``batch_size`` one of
            :data:`BATCH_SIZES`). trials: random batches drawn per setting (their seeds 0 …).

    Raises:
        TypeError / ValueError: a starting value the panel does not offer, an empty prompt.
    """
    if isinstance(prompt, str):
        prompt = lm.encode(prompt)
    prompt = check_token_ids("prompt", prompt, lm.model.config.vocab_size)
    panel_choice("dtype", dtype, tuple(DTYPES))
    panel_choice("mode", mode, MODES)
    panel_choice("batch_size", batch_size, BATCH_SIZES)
    panel_int("trials", trials, 1, 10)
    check_int("width_px", width_px, 200, 4000)
    dtype_w = widgets.ToggleButtons(options=list(DTYPES), value=dtype, description=tr("format"))
    modes = {"default": tr("default"), "batch-invariant": tr("batch-invariant")}            # value → label shown
    mode_w = widgets.ToggleButtons(options=[(modes[m], m) for m in MODES], value=mode, description=tr("engine"))
    size_w = widgets.SelectionSlider(options=list(BATCH_SIZES), value=batch_size, description=tr("batch size"),
                                     continuous_update=False, style={"description_width": "initial"})
    readout, error = widgets.HTML(), widgets.HTML()
    chart = FigureOutput(width=width_px)
    models, runners = {"float32": lm}, {}

    def runner(d: str, m: str) -> ModelRunner:
        if (d, m) not in runners:
            if d not in models:
                models[d] = in_dtype(lm, d)
            runners[(d, m)] = ModelRunner(models[d], 16, 160, batch_invariant=m == "batch-invariant")
        return runners[(d, m)]

    @guarded(lambda msg: setattr(error, "value", msg))
    def redraw(_change=None):
        error.value = ""
        r = runner(dtype_w.value, mode_w.value)
        sizes = [b for b in BATCH_SIZES if b <= size_w.value]
        runs = {tr("batch {k}", k=k + 1): batch_variance(r, prompt, sizes, seed=k) for k in range(trials)}
        last = [rows[-1] for rows in runs.values()]
        worst = max(max(v.prefill_diff, v.decode_diff) for v in last)
        flips = sum(not v.same_argmax for v in last)
        readout.value = "<div style='font-size:16px'>" + tr(
            "{dtype}, {mode}, batch of {b}: largest |Δ logit| <b>{worst:.2g}</b> · bit-identical in <b>{same} of "
            "{n}</b> random batches · a greedy token changed in <b>{flips}</b>",
            dtype=dtype_w.value, mode=modes[mode_w.value], b=size_w.value, worst=worst,
            same=sum(v.identical for v in last), n=len(last), flips=flips) + "</div>"
        chart.show(batch_variance_figure(runs))

    for w in (dtype_w, mode_w, size_w):
        w.observe(redraw, names="value")
    redraw()
    box = Panel([widgets.HBox([dtype_w]), widgets.HBox([mode_w, size_w]), readout, chart, error])
    box.error = error
    return box
