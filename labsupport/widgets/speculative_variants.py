"""The panel of chapter 07: pick a cheap-draft method, its γ or tree shape and the temperature;
run it on the real target in the paged engine and draw one round's verified token tree with the
accepted path. Thin wiring: sliders → ``labsupport.speculative`` → ``labsupport.viz``.
An error in a callback is shown in the panel (a red line); the panel keeps working.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from labsupport.i18n import tr
from labsupport.models import LoadedModel
from labsupport.sampling import SamplingParams
from labsupport.speculative.engine import SpeculativeEngine
from labsupport.speculative.lookahead import LookaheadProposer
from labsupport.speculative.medusa import MedusaHeads, MedusaProposer
from labsupport.speculative.self_spec import SelfSpecProposer
from labsupport.speculative.tree import chain_tree
from labsupport.viz.speculative_variants import token_tree_figure

from .common import show_figure
from .snapshot import Panel
from .speculative import _stat

__all__ = ["SHAPES", "variants_panel"]

_WIDE = {"description_width": "initial"}
SHAPES = {"chain (1, 1, 1)": (1, 1, 1), "(2, 1, 1)": (2, 1, 1), "(3, 2, 1)": (3, 2, 1), "(4, 2, 2)": (4, 2, 2),
          "(5, 3, 2)": (5, 3, 2)}
METHODS = ("Medusa heads", "self-speculation", "lookahead")


def _make(method: str, heads: MedusaHeads, shape, gamma: int, layers: int):
    if method == "Medusa heads":
        return MedusaProposer(heads, widths=SHAPES[shape])
    if method == "self-speculation":
        return SelfSpecProposer(layers, gamma)
    return LookaheadProposer(window=gamma, ngram=4, max_candidates=3)


def variants_panel(target: LoadedModel, heads: MedusaHeads, prompt: str, *, method: str = "Medusa heads",
                   shape: str = "(3, 2, 1)", gamma: int = 3, layers: int = 2, temperature: float = 0.0,
                   max_new_tokens: int = 32) -> widgets.VBox:
    """Controls: method, tree shape (Medusa), γ (self-speculation: draft length; lookahead: Jacobi
    window), layers k (self-speculation), temperature (> 0: chain verification with the exact
    rejection rule), round (which round's tree to draw).

    Returns:
        VBox with ``controls``, ``figure`` (an ``ipywidgets.Output`` showing the tree), ``stats``, ``error``,
        ``update`` and ``state["output"]``.

    Raises:
        ValueError: an initial value outside the sliders' range.
    """
    if method not in METHODS or shape not in SHAPES:
        raise ValueError(f"method must be one of {METHODS} and shape one of {list(SHAPES)}, got {method!r}, {shape!r}")
    n_layers = target.model.config.n_layer
    if not 1 <= layers < n_layers or not 1 <= gamma <= 6 or not 0 <= temperature <= 1.5:
        raise ValueError(f"layers must be in [1, {n_layers - 1}], gamma in [1, 6], temperature in [0, 1.5]; "
                         f"got {layers}, {gamma}, {temperature}")
    method_names = {"Medusa heads": tr("Medusa heads"), "self-speculation": tr("self-speculation"),
                    "lookahead": tr("lookahead")}                                   # value → label shown
    shape_names = {"chain (1, 1, 1)": tr("chain (1, 1, 1)")}                          # the others are numbers
    controls = {
        "method": widgets.ToggleButtons(options=[(method_names[m], m) for m in METHODS], value=method,
                                        description=tr("method"), style=_WIDE),
        "shape": widgets.Dropdown(options=[(shape_names.get(k, k), k) for k in SHAPES], value=shape,
                                  description=tr("tree (top-k per depth)"), style=_WIDE),
        "gamma": widgets.IntSlider(value=gamma, min=1, max=6, description=tr("γ / window"), style=_WIDE,
                                   continuous_update=False),
        "layers": widgets.IntSlider(value=layers, min=1, max=n_layers - 1, description=tr("draft layers k"),
                                    style=_WIDE, continuous_update=False),
        "temperature": widgets.FloatSlider(value=temperature, min=0.0, max=1.5, step=0.1, description=tr("temperature"),
                                           style=_WIDE, continuous_update=False),
        "round": widgets.IntSlider(value=3, min=0, max=40, description=tr("round shown"), style=_WIDE,
                                   continuous_update=False),
    }
    # A plain plotly output redrawn on every change (show_figure), not a FigureWidget updated in place:
    # that one rendered as empty axes in JupyterLab, in both browser runs of chapter 07.
    figure = widgets.Output()
    stats, error, text, note = widgets.HTML(), widgets.HTML(), widgets.HTML(), widgets.HTML()
    state: dict = {}

    def redraw(*_):
        out = state.get("output")
        if out is None:
            return
        i = min(controls["round"].value, len(out.rounds) - 1)
        rec = out.rounds[i]
        if out.trees and i < len(out.trees):
            tree, path = out.trees[i]
        else:                                          # a chain round (sampling or self-speculation)
            tree = chain_tree(out.prompt_ids[-1] if i == 0 else 0, rec.draft_tokens)
            path = list(range(1, rec.num_accepted + 1))
        root = ([*out.prompt_ids, *out.token_ids])[rec.position - 1]
        tokens = [root, *tree.tokens[1:]]
        show_figure(figure, token_tree_figure(tokens, tree.parents, path, rec.next_token, target.token_str,
                                              title=tr("Round {i}: {candidates} candidates, {accepted} accepted",
                                                       i=i, candidates=len(tokens) - 1, accepted=len(path))))

    def show_active(c: dict) -> None:
        """Grey out the controls the chosen method does not read, and say why."""
        medusa, sampling = c["method"] == "Medusa heads", c["temperature"] > 0
        controls["shape"].disabled = not medusa or sampling
        controls["gamma"].disabled = medusa
        controls["layers"].disabled = c["method"] != "self-speculation"
        why = []
        if medusa:
            why.append(tr("γ is the tree's depth under Medusa (set by the tree shape)"))
            if sampling:
                why.append(tr("at T > 0 Medusa drafts one chain from its heads (a tree is verified greedily only)"))
        elif c["method"] == "lookahead":
            why.append(tr("γ is the Jacobi window under lookahead"))
        note.value = ("<div style='font-size:14px;color:#555'>" + html.escape("; ".join(why)) + "</div>") if why else ""

    def update(*_):
        try:
            c = {k: w.value for k, w in controls.items()}
            show_active(c)
            proposer = _make(c["method"], heads, c["shape"], c["gamma"], c["layers"])
            engine = SpeculativeEngine(target, proposer, keep_trees=True)
            params = SamplingParams(temperature=c["temperature"], seed=0, ignore_eos=True)
            out = engine.generate([prompt], params, max_new_tokens)[0]
            state["output"] = out
            controls["round"].max = max(0, len(out.rounds) - 1)
            st = out.spec_stats
            stats.value = "".join([
                _stat(tr("tokens / target forward"), f"{st.tokens_per_round:.2f}"),
                _stat(tr("α at depth 1"), f"{st.acceptance_by_position[0]:.2f}"),
                _stat(tr("nodes verified / round"), f"{engine.num_verified_tokens / engine.num_rounds:.1f}"),
                _stat(tr("target forwards"), tr("{forwards} for {tokens} tokens", forwards=engine.num_rounds,
                                                tokens=len(out.token_ids))),
            ])
            text.value = (f"<div style='font-size:16px;font-family:monospace;white-space:pre-wrap'>"
                          f"<b>{html.escape(prompt)}</b>{html.escape(out.text)}</div>")
            redraw()
            error.value = ""
        except Exception as err:  # noqa: BLE001 - a panel shows its errors, it never raises
            error.value = f"<span style='color:#d62728'>{html.escape(type(err).__name__ + ': ' + str(err))}</span>"

    for k, w in controls.items():
        w.observe(redraw if k == "round" else update, names="value")
    update()
    box = Panel([controls["method"], widgets.HBox([controls["shape"], controls["temperature"]]),
                        widgets.HBox([controls["gamma"], controls["layers"]]), note, controls["round"], stats, error,
                        figure, text])
    box.controls, box.figure, box.stats, box.error, box.update, box.state = controls, figure, stats, error, update, state
    return box
