"""Panels of chapter 06 (speculative decoding): the theory panel and the real-pair round panel.

Thin wiring: sliders → ``labsupport.speculative`` → figures from ``labsupport.viz.speculative``
shown as plain plotly outputs redrawn on every change (:class:`FigureOutput`). Each panel computes its first state when
built (so it shows something where callbacks never run, e.g. under nbval) and returns an
``ipywidgets.VBox`` carrying ``controls`` (dict of input widgets), ``figure`` (or
``figures``), ``stats`` (an ``HTML`` readout) and ``update()``.
"""

from __future__ import annotations

import html
import math
from types import SimpleNamespace

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go

from labsupport.i18n import tr
from labsupport.models import LoadedModel
from labsupport.sampling import SamplingParams
from labsupport.speculative import (
    DraftModelProposer,
    NgramProposer,
    accepted_prefix_length,
    best_gamma,
    check_same_vocabulary,
    expected_tokens_per_round,
    simulate_rounds,
    speculative_generate,
    speedup,
)
from labsupport.viz.speculative import rounds_figure, speedup_curve_figure
from labsupport.widgets.common import FigureOutput, guarded, panel_int, panel_real
from labsupport.widgets.snapshot import Panel

_WIDE = {"description_width": "initial"}


def _stat(name: str, value: str) -> str:
    return (f"<div style='display:inline-block;margin:0 22px 6px 0'><div style='font-size:14px;color:#555'>"
            f"{name}</div><div style='font-size:20px;font-weight:600'>{value}</div></div>")


def _copy_figure(target: FigureOutput, new: go.Figure) -> None:
    """Show ``new`` in ``target`` (the whole figure, redrawn)."""
    target.show(new)


def flags_to_rounds(flags: np.ndarray) -> list[SimpleNamespace]:
    """Simulated rounds (``(n, γ)`` raw acceptance flags) as round objects for ``rounds_figure``:
    draft tokens are numbered 1..γ (label ``d1…``), the target's token is 0 (label ``t``)."""
    n_acc = accepted_prefix_length(flags)
    g = flags.shape[1]
    return [SimpleNamespace(draft_tokens=list(range(1, g + 1)), num_accepted=int(n), next_token=0,
                            bonus=int(n) == g) for n in n_acc]


def _number(x: float) -> str:
    """``x`` to 2 decimals, or "–" when there is nothing to measure (NaN: nothing was proposed)."""
    return "–" if x is None or not math.isfinite(x) else f"{x:.2f}"


def _sim_label(i: int) -> str:
    return "t" if i == 0 else f"d{i}"


def theory_panel(alpha: float = 0.8, gamma: int = 4, c: float = 0.05, *, gamma_max: int = 12,
                 n_rounds: int = 4000, seed: int = 0) -> widgets.VBox:
    """Theory vs Monte Carlo of speculative rounds, with sliders α, γ, c and verification cost s.

    Top: speed-up vs γ — theory ``(1−α^(γ+1)) / ((1−α)(γc + v))`` with ``v(γ) = 1 + s·γ``
    (s = 0 is the textbook's free verification), Monte Carlo points from ``n_rounds`` simulated
    rounds per γ, the best γ. Bottom: 12 simulated rounds at the selected γ.

    Returns:
        VBox with ``controls`` (alpha, gamma, c, s), ``figures`` (curve, rounds), ``stats``,
        ``update``.

    Raises:
        TypeError / ValueError: a starting value outside its slider's range (α 0.05–0.99,
            γ 1–``gamma_max``, c 0–0.6, ``gamma_max`` 1–64, ``n_rounds`` 1–10⁶, ``seed`` ≥ 0).
    """
    panel_int("gamma_max", gamma_max, 1, 64)
    panel_real("alpha", alpha, 0.05, 0.99)
    panel_int("gamma", gamma, 1, gamma_max)
    panel_real("c", c, 0.0, 0.6)
    panel_int("n_rounds", n_rounds, 1, 1_000_000)
    panel_int("seed", seed, 0, 2 ** 32 - 1)
    controls = {
        "alpha": widgets.FloatSlider(value=alpha, min=0.05, max=0.99, step=0.01, description=tr("acceptance α"),
                                     style=_WIDE, continuous_update=False),
        "gamma": widgets.IntSlider(value=gamma, min=1, max=gamma_max, description=tr("draft length γ"), style=_WIDE,
                                   continuous_update=False),
        "c": widgets.FloatSlider(value=c, min=0.0, max=0.6, step=0.01, description=tr("draft cost c"), style=_WIDE,
                                 continuous_update=False),
        "s": widgets.FloatSlider(value=0.0, min=0.0, max=0.5, step=0.01, description=tr("verify cost/token s"),
                                 style=_WIDE, continuous_update=False),
    }
    gammas = list(range(1, gamma_max + 1))
    curve, strip = FigureOutput(), FigureOutput()            # drawn by update() below
    stats = widgets.HTML()
    error = widgets.HTML()

    @guarded(lambda msg: setattr(error, "value", msg))
    def update(*_):
        a, g, cc, s = (controls[k].value for k in ("alpha", "gamma", "c", "s"))
        rng = np.random.default_rng(seed)
        v = [1.0 + s * k for k in range(gamma_max + 1)]
        mc_tokens = [float(np.mean(accepted_prefix_length(simulate_rounds(a, k, n_rounds, rng)) + 1)) for k in gammas]
        theory = [speedup(a, k, cc, v[k]) for k in gammas]
        mc = [t / (k * cc + v[k]) for t, k in zip(mc_tokens, gammas)]
        best = best_gamma(a, cc, gamma_max, v=v)
        _copy_figure(curve, speedup_curve_figure(gammas, [expected_tokens_per_round(a, k) for k in gammas], theory,
                                                 mc, best=best, selected=g,
                                                 title=tr("Speed-up vs γ at α = {alpha:.2f}, c = {c:.2f}, v(γ) = 1 + {s:.2f}γ",
                                                          alpha=a, c=cc, s=s)))
        flags = simulate_rounds(a, g, 12, np.random.default_rng(seed + g))
        _copy_figure(strip, rounds_figure(flags_to_rounds(flags), _sim_label,
                                          title=tr("12 simulated rounds at γ = {gamma} (t = the target's own token)", gamma=g)))
        stats.value = "".join([
            _stat(tr("tokens / target forward (theory)"), f"{expected_tokens_per_round(a, g):.2f}"),
            _stat(tr("Monte Carlo ({n} rounds)", n=n_rounds), f"{mc_tokens[g - 1]:.2f}"),
            _stat(tr("speed-up theory / MC"), f"{theory[g - 1]:.2f}× / {mc[g - 1]:.2f}×"),
            _stat(tr("best γ"), tr("≥ {gamma} (edge of the range, {speedup:.2f}×)", gamma=best[0], speedup=best[1])
                  if best[0] == gamma_max else f"{best[0]} ({best[1]:.2f}×)"),
        ])

    for w in controls.values():
        w.observe(update, names="value")
    update()
    box = Panel([widgets.HBox([controls["alpha"], controls["gamma"]]),
                        widgets.HBox([controls["c"], controls["s"]]), stats, curve, strip, error])
    box.error = error
    box.controls, box.figures, box.stats, box.update = controls, (curve, strip), stats, update
    box.figure = curve
    return box


def round_panel(target: LoadedModel, draft: LoadedModel, prompt: str, *, gamma: int = 4, temperature: float = 0.0,
                max_new_tokens: int = 40, seed: int = 0, max_rounds: int = 10) -> widgets.VBox:
    """Run real speculative decoding and draw its first rounds with the real tokens.

    Controls: proposer (draft model / n-gram), γ (1–8), temperature (0 = greedy), seed. The
    readout shows measured α, tokens per target forward next to the theory at that α, and the
    generated text.

    Returns:
        VBox with ``controls``, ``figure``, ``stats``, ``update`` and ``result`` (the last
        :class:`labsupport.speculative.SpeculativeResult`, in ``box.state["result"]``).

    Raises:
        ValueError: draft and target do not share a vocabulary (checked once, here), or a
            starting value outside its slider's range (γ 1–8, temperature 0–1.5, seed 0–20).
        TypeError: a starting value of the wrong type.
    """
    panel_int("gamma", gamma, 1, 8)
    panel_real("temperature", temperature, 0.0, 1.5)
    panel_int("seed", seed, 0, 20)
    panel_int("max_new_tokens", max_new_tokens, 1, 10_000)
    panel_int("max_rounds", max_rounds, 1, 100)
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    check_same_vocabulary(target, draft)
    proposers = {"draft model": lambda g: DraftModelProposer(draft, target, g), "n-gram": NgramProposer}  # γ → proposer
    names = {"draft model": tr("draft model"), "n-gram": "n-gram"}                      # value → label shown
    controls = {
        "proposer": widgets.ToggleButtons(options=[(names[k], k) for k in proposers], value="draft model",
                                          description=tr("proposer"), style=_WIDE),
        "gamma": widgets.IntSlider(value=gamma, min=1, max=8, description=tr("draft length γ"), style=_WIDE,
                                   continuous_update=False),
        "temperature": widgets.FloatSlider(value=temperature, min=0.0, max=1.5, step=0.1, description=tr("temperature"),
                                           style=_WIDE, continuous_update=False),
        "seed": widgets.IntSlider(value=seed, min=0, max=20, description=tr("seed"), style=_WIDE,
                                  continuous_update=False),
    }
    figure = FigureOutput()                                 # drawn by update() below
    stats = widgets.HTML()
    text = widgets.HTML()
    state = {}
    error = widgets.HTML()

    @guarded(lambda msg: setattr(error, "value", msg))
    def update(*_):
        g, t, s = controls["gamma"].value, controls["temperature"].value, controls["seed"].value
        params = SamplingParams(temperature=t, seed=s)
        res = speculative_generate(target, proposers[controls["proposer"].value](g), prompt, params,
                                   max_new_tokens=max_new_tokens)
        state["result"] = res
        st = res.stats
        _copy_figure(figure, rounds_figure(res.rounds, target.token_str, max_rounds=max_rounds,
                                           title=tr("First rounds: {proposer}, γ = {gamma}, T = {t:g}",
                                                    proposer=names[controls["proposer"].value], gamma=g, t=t)))
        theory = st.theory_tokens_per_round
        stats.value = "".join([
            _stat(tr("measured α"), _number(st.alpha)),
            _stat(tr("tokens / target forward"), _number(st.tokens_per_round)),
            _stat(tr("theory at that α"), _number(theory)),
            _stat(tr("target forwards"), tr("{forwards} for {tokens} tokens", forwards=st.target_forwards,
                                            tokens=len(res.token_ids))),
        ])
        text.value = (f"<div style='font-size:16px;font-family:monospace;white-space:pre-wrap'>"
                      f"<b>{html.escape(prompt)}</b>{html.escape(res.text)}</div>")

    for w in controls.values():
        w.observe(update, names="value")
    update()
    box = Panel([controls["proposer"], widgets.HBox([controls["gamma"], controls["temperature"]]),
                        controls["seed"], stats, figure, text, error])
    box.error = error
    box.controls, box.figure, box.stats, box.update, box.state = controls, figure, stats, update, state
    return box
