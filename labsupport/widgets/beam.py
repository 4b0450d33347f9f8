"""The beam-tree explorer: prompt, beam width, depth and length penalty → the real model's search tree.

Thin wiring only: sliders → :func:`labsupport.beam.beam_search` → :func:`labsupport.viz.beam.beam_tree_figure`.
The panel draws its first state when it is built (so it shows something under nbval, where
callbacks never run); afterwards each change recomputes the search and redraws the figure in
its ``ipywidgets.Output`` (:func:`show_figure`). Errors and messages go into another ``Output``.
"""

from __future__ import annotations

import html
import time

import ipywidgets as widgets
from IPython.display import HTML

from labsupport.widgets.snapshot import Panel

from ..beam import beam_search
from ..generation import generate
from ..i18n import tr
from ..models import LoadedModel
from ..sampling import GREEDY
from ..viz.beam import beam_tree_figure, display_text
from .common import PLOTLY_MIME, error_html, panel_int, panel_real, panel_text, show_figure  # noqa: F401 - re-exported


def _summary(lm: LoadedModel, result, greedy, seconds: float) -> str:
    best = result.best
    g_bits = greedy.logprob / 0.6931471805599453
    rows = [
        (tr("beam search"), best.text, best.log2prob, best.score),
        (tr("greedy (B = 1)"), greedy.text, g_bits, None),
    ]
    pad = "padding: 2px 14px 2px 0"
    cells = "".join(
        f"<tr><td style='{pad}'><b>{name}</b></td><td style='{pad}'><code>{html.escape(display_text(text))}</code></td>"
        f"<td style='{pad}'>{bits:.2f}</td><td style='{pad}'>{'' if score is None else f'{score:.3f}'}</td></tr>"
        for name, text, bits, score in rows)
    diff = best.log2prob - g_bits if len(best.token_ids) == len(greedy.token_ids) else None
    note = (tr("score difference (log₂): <b>{diff:+.2f}</b>", diff=diff) if diff is not None
            else tr("the two outputs have different lengths: compare their scores, not the raw sums"))
    cost = (tr("{calls} model call, {forwards} token-forwards", calls=result.model_calls, forwards=result.token_forwards)
            if result.model_calls == 1 else
            tr("{calls} model calls, {forwards} token-forwards", calls=result.model_calls,
               forwards=result.token_forwards))
    return (f"<table style='font-size:15px'><tr><th style='{pad}'></th><th style='{pad}'>{tr('text')}</th>"
            f"<th style='{pad}'>Σ log₂ p</th><th style='{pad}'>{tr('score (Σ ln p / len^α)')}</th></tr>"
            f"{cells}</table><div style='font-size:15px'>{note} · {cost} · {seconds * 1e3:.0f} ms</div>")


def beam_explorer(lm: LoadedModel, prompt: str = "Return the number of", beam_width: int = 3,
                  depth: int = 5, length_penalty: float = 1.0, max_children: int = 3,
                  width_px: int = 940) -> widgets.VBox:
    """A panel exploring beam search on ``lm``.

    Args:
        lm: the model (the shipped ``tiny-gpt2`` in the chapter).
        prompt: initial prompt text.
        beam_width: initial B (slider 1–6).
        depth: initial number of new tokens (slider 1–8).
        length_penalty: initial α (slider −1 … 3).
        max_children: candidates drawn per beam besides the kept ones.
        width_px: width of the tree figure in pixels.

    Returns:
        A ``VBox`` with the controls, the tree (an ``Output`` showing the figure), a summary and a
        message area.

    Raises:
        TypeError / ValueError: a starting value outside its slider's range (B 1–6, depth 1–8,
            α −1 … 3) or ``max_children`` not an integer ≥ 0.
    """
    panel_text("prompt", prompt)
    panel_int("beam_width", beam_width, 1, 6)
    panel_int("depth", depth, 1, 8)
    panel_real("length_penalty", length_penalty, -1.0, 3.0)
    panel_int("max_children", max_children, 0, 20)
    panel_int("width_px", width_px, 200, 4000)
    prompt_box = widgets.Text(value=prompt, description=tr("prompt"), continuous_update=False,
                              layout=widgets.Layout(width="60%"))
    width = widgets.IntSlider(value=beam_width, min=1, max=6, description=tr("beam width B"), continuous_update=False,
                              style={"description_width": "initial"})
    steps = widgets.IntSlider(value=depth, min=1, max=8, description=tr("depth"), continuous_update=False)
    alpha = widgets.FloatSlider(value=length_penalty, min=-1.0, max=3.0, step=0.1, description=tr("length penalty α"),
                                continuous_update=False, style={"description_width": "initial"})
    early = widgets.Dropdown(options=[(tr("False (HF default)"), False), ("True", True), ("'never'", "never")],
                             value=False, description="early_stopping", style={"description_width": "initial"})
    summary = widgets.HTML()
    out = widgets.Output()

    def compute():
        start = time.perf_counter()
        result = beam_search(lm, prompt_box.value, width.value, max_new_tokens=steps.value,
                             length_penalty=alpha.value, early_stopping=early.value)
        greedy = generate(lm, prompt_box.value, GREEDY, max_new_tokens=steps.value)
        seconds = time.perf_counter() - start
        fig = beam_tree_figure(result, max_children=max_children, prompt_label=lm.decode(result.prompt_ids),
                               width=width_px)
        return fig, _summary(lm, result, greedy, seconds)

    tree = widgets.Output()
    fig, summary.value = compute()
    show_figure(tree, fig)

    def redraw(_change=None):
        out.outputs = ()
        try:
            new_fig, new_text = compute()
        except Exception as err:                 # noqa: BLE001 - e.g. an empty prompt: say so, keep the last tree
            out.append_display_data(HTML(error_html(err)))
            return
        show_figure(tree, new_fig)
        summary.value = new_text

    for control in (prompt_box, width, steps, alpha, early):
        control.observe(redraw, names="value")
    controls = widgets.VBox([prompt_box, widgets.HBox([width, steps]), widgets.HBox([alpha, early])])
    return Panel([controls, tree, summary, out])
