"""Panels of chapter 01 (sampling): the temperature panel and the sampling lab.

Thin wiring only: sliders → ``labsupport.sampling`` / ``labsupport.generation`` → a figure
from ``labsupport.viz.sampling`` shown as a ``go.FigureWidget`` whose traces are updated in
place. Each panel computes its first state when it is built (so it shows something even
where callbacks never run, e.g. under nbval) and returns an ``ipywidgets.VBox`` that also
carries, for tests and for curious students:

* ``panel.controls`` – dict of the input widgets by name,
* ``panel.figure`` – the ``go.FigureWidget``,
* ``panel.update()`` – recompute everything from the current control values,
* ``panel.cache`` – the next-token cache (``.forwards`` counts model forwards).

The logits of the current prompt are cached: moving a slider costs a softmax over the
vocabulary (and, in the lab, one short seeded generation), never a new prompt forward.
"""

from __future__ import annotations

import html
from collections import Counter

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from IPython.display import HTML

from labsupport.generation import generate, generate_batch, log2_prob, next_token_logits
from labsupport.models import LoadedModel, max_positions
from labsupport.sampling import (
    SamplingParams,
    candidates_for_mass,
    entropy_bits,
    perplexity,
    probs_from_logits,
    trace_filters,
)
from labsupport.validation import check_int, check_real
from labsupport.viz.sampling import distribution_figure, filter_figure, unique_labels
from labsupport.widgets.common import panel_int, panel_real

_WIDE = {"description_width": "initial"}


class NextTokenCache:
    """The last prompt's token ids and next-token logits; a forward runs only for a new prompt.

    ``get(prompt, reserve)`` returns ``(ids, logits)``: ``ids`` are the prompt's token ids
    keeping only the last ``max_positions(model) - reserve`` tokens (so that ``reserve`` new
    tokens still fit; documented truncation, reported by ``truncated``), ``logits`` is the
    ``(vocab,)`` float32 tensor for the token after them.

    Raises:
        ValueError: the prompt has no tokens.
    """

    def __init__(self, lm: LoadedModel):
        self.lm = lm
        self.forwards = 0
        self.truncated = 0
        self._key: tuple[str, int] | None = None
        self._value: tuple[list[int], torch.Tensor] | None = None

    def get(self, prompt: str, reserve: int = 0) -> tuple[list[int], torch.Tensor]:
        key = (prompt, reserve)
        if key != self._key:
            ids = self.lm.encode(prompt)
            if not ids:
                raise ValueError("prompt must contain at least one token, got an empty prompt")
            keep = max(1, max_positions(self.lm.model) - reserve)
            self.truncated = max(0, len(ids) - keep)
            ids = ids[-keep:]
            logits = next_token_logits(self.lm, ids)
            self.forwards += 1
            self._key, self._value = key, (ids, logits)
        return self._value


def _refresh(figure: go.FigureWidget, fresh: go.Figure) -> None:
    """Copy ``x``, ``y`` and ``text`` of every trace of ``fresh`` into ``figure``, one message per trace.

    Not one ``batch_update`` over all traces: for a property that changed on some traces only,
    plotly sends an ``"_undefined_"`` placeholder for the others, which its browser side (plotly
    6–7) stores as data before the figure is first drawn (bars then jump to their index).
    """
    for old, new in zip(figure.data, fresh.data):
        changes = {"x": new.x, "y": new.y}
        if new.text is not None:
            changes["text"] = new.text
        old.update(changes)


def _labels(lm: LoadedModel, ids: list[int]) -> list[str]:
    return unique_labels([lm.token_str(i) for i in ids])


def _error_html(err: Exception) -> str:
    return f"<span style='color:#b00020;font-size:16px'>⚠ {html.escape(str(err))}</span>"


def _stat(name: str, value: str) -> str:
    return (f"<div style='display:inline-block;margin:0 22px 6px 0'><div style='font-size:14px;color:#555'>"
            f"{name}</div><div style='font-size:22px;font-weight:600'>{value}</div></div>")


def temperature_panel(lm: LoadedModel, prompt: str = "Return the number of", *, temperature: float = 1.0,
                      top_n: int = 20, shift: float = 10.0) -> widgets.VBox:
    """Temperature and distribution, on the real model.

    Controls: an editable prompt, a temperature slider (0 = greedy … 3), a button that adds
    ``shift`` to *every* logit and one that resets it. Shows the logits and probabilities of
    the ``top_n`` most likely next tokens, the maximum probability, the entropy (bits),
    the perplexity ``2^H`` and the number of candidates needed for 90 % of the mass, computed
    over the whole vocabulary with ``labsupport.sampling``. After a shift it also shows the
    largest change of any probability (zero up to float32 rounding: shift invariance).

    Args:
        lm: a loaded model (``labsupport.models.load_model``).
        prompt: the starting prompt.
        temperature: starting T, in [0, 3].
        top_n: candidates shown as bars (≥ 1; at most the vocabulary).
        shift: the constant the shift button adds to all logits.

    Returns:
        The panel (``ipywidgets.VBox``) with ``controls``, ``figure``, ``update``, ``cache``.

    Raises:
        ValueError: ``top_n`` < 1 or ``temperature`` outside [0, 3].
    """
    check_int("top_n", top_n, 1)
    check_real("temperature", temperature, 0, 3, hint=" for this panel")
    top_n = min(top_n, lm.model.config.vocab_size)
    cache = NextTokenCache(lm)
    prompt_box = widgets.Text(value=prompt, description="prompt", continuous_update=False,
                              layout=widgets.Layout(width="95%"), style=_WIDE)
    t_slider = widgets.FloatSlider(value=temperature, min=0.0, max=3.0, step=0.05, description="temperature T",
                                   continuous_update=True, readout_format=".2f", style=_WIDE,
                                   layout=widgets.Layout(width="60%"))
    shift_button = widgets.Button(description=f"add {shift:+g} to every logit", icon="plus",
                                  layout=widgets.Layout(width="auto"))
    reset_button = widgets.Button(description="reset shift", layout=widgets.Layout(width="auto"))
    stats = widgets.HTML()
    state = {"offset": 0.0, "top": None}
    figure = go.FigureWidget(distribution_figure(["…"] * top_n, [0.0] * top_n, [0.0] * top_n))

    def update(*_):
        try:
            ids, logits = cache.get(prompt_box.value)
        except (TypeError, ValueError) as err:
            stats.value = _error_html(err)
            return
        t = float(t_slider.value)
        params = SamplingParams(temperature=t)
        z = logits + state["offset"]                               # (vocab,) shifted logits
        p = probs_from_logits(z, params)                           # (vocab,) over the whole vocabulary
        p_unshifted = probs_from_logits(logits, params)
        top = torch.topk(logits, top_n).indices.tolist()           # order does not depend on T or shift
        h = float(entropy_bits(p))
        _refresh(figure, distribution_figure(_labels(lm, top), z[top].tolist(), p[top].tolist()))
        figure.layout.xaxis2.title.text = f"probability p at T = {t:g}" + (" (greedy)" if t == 0 else "")
        figure.layout.title.text = f"Next token after “{html.escape(prompt_box.value[-40:])}”"
        parts = [_stat("max probability", f"{100 * float(p.max()):.1f} %"),
                 _stat("entropy H", f"{h:.2f} bits"),
                 _stat("perplexity 2<sup>H</sup>", f"{float(perplexity(p)):.1f}"),
                 _stat("candidates for 90 %", f"{candidates_for_mass(p, 0.9):,} of {p.numel():,}")]
        if state["offset"]:
            dp = float((p - p_unshifted).abs().max())
            parts.append(_stat(f"logits shifted by {state['offset']:+g}: max |Δp|", f"{dp:.1e}"))
        if cache.truncated:
            parts.append(f"<div>(prompt cut to its last {len(ids)} tokens)</div>")
        stats.value = "".join(parts)

    def on_shift(_):
        state["offset"] += shift
        update()

    def on_reset(_):
        state["offset"] = 0.0
        update()

    prompt_box.observe(update, names="value")
    t_slider.observe(update, names="value")
    shift_button.on_click(on_shift)
    reset_button.on_click(on_reset)
    update()
    box = widgets.VBox([prompt_box, widgets.HBox([t_slider, shift_button, reset_button]), stats, figure])
    box.controls = {"prompt": prompt_box, "temperature": t_slider, "shift": shift_button, "reset": reset_button}
    box.figure, box.stats, box.update, box.cache = figure, stats, update, cache
    return box


def _samples_html(texts: list[str], first_ids: list[int], prompt_tail: str, seed: int) -> str:
    counts = Counter(texts)
    rows = "".join(
        f"<tr><td style='text-align:right;padding:2px 10px'>{c}×</td>"
        f"<td style='white-space:pre-wrap;text-align:left;padding:2px 6px'><span style='color:#777'>…{html.escape(prompt_tail)}</span>"
        f"<b>{html.escape(t)}</b></td></tr>" for t, c in counts.most_common())
    return (f"<div style='font-size:16px'><b>{len(texts)} samples</b> (one generator seeded with {seed}): "
            f"<b>{len(counts)} distinct</b> continuations, {len(set(first_ids))} distinct first tokens."
            f"<table style='font-size:15px;margin-top:6px'>{rows}</table></div>")


def sampling_lab(lm: LoadedModel, prompt: str = "The default value is", *, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 seed: int = 0, max_new_tokens: int = 20, n_samples: int = 20, top_n: int = 15) -> widgets.VBox:
    """The sampling lab, on the real model.

    Sliders for temperature (0 = greedy), top-k (0 = off), top-p, min-p, repetition penalty θ,
    frequency and presence penalties (over the generated tokens; they shape the continuation, not
    the first token's bars), the seed and the number of new tokens. Shows the ``top_n`` most likely next tokens after
    the prompt, kept (probability actually sampled from) versus cut (with the filter that cut
    them, from ``labsupport.sampling.trace_filters``), a seeded continuation of
    ``max_new_tokens`` tokens with its Σ log₂ p, and a button that draws ``n_samples``
    continuations into an ``ipywidgets.Output`` with their diversity (distinct count).

    Args:
        lm: a loaded model.
        prompt: the starting prompt (editable).
        temperature, top_k, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty:
            starting values (validated by
            :class:`labsupport.sampling.SamplingParams`, then against the sliders: T 0–5,
            top-k 0–vocabulary, top-p 0.01–1, θ 0.1–3).
        seed: starting seed (0–99) of the ``torch.Generator`` used for sampling.
        max_new_tokens: starting continuation length in tokens (1–60).
        n_samples: continuations drawn by the samples button (≥ 1).
        top_n: candidates shown as bars.

    Returns:
        The panel (``ipywidgets.VBox``) with ``controls``, ``figure``, ``update``, ``cache``,
        ``samples`` (the button's callback, also callable directly) and ``output``.

    Raises:
        ValueError: a starting value outside its range.
    """
    panel_int("max_new_tokens", max_new_tokens, 1, 60)
    SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                   repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
                   presence_penalty=presence_penalty, max_tokens=max_new_tokens)        # validates
    vocab = int(lm.model.config.vocab_size)
    for name, value, lo, hi in (("temperature", temperature, 0.0, 5.0), ("top_p", top_p, 0.01, 1.0),
                                ("repetition_penalty", repetition_penalty, 0.1, 3.0)):
        panel_real(name, value, lo, hi)                   # the sliders' ranges (the core allows more)
    panel_int("top_k", top_k, 0, vocab)
    for name, value, lo, hi in (("seed", seed, 0, 99), ("max_new_tokens", max_new_tokens, 1, 60),
                                ("n_samples", n_samples, 1, 100), ("top_n", top_n, 1, 100)):
        check_int(name, value, lo, hi)
    top_n = min(top_n, lm.model.config.vocab_size)
    cache = NextTokenCache(lm)

    def slider(cls, value, lo, hi, step, name, fmt=None):
        kw = {"readout_format": fmt} if fmt else {}
        return cls(value=value, min=lo, max=hi, step=step, description=name, continuous_update=False,
                   style=_WIDE, layout=widgets.Layout(width="95%"), **kw)

    controls = {
        "prompt": widgets.Text(value=prompt, description="prompt", continuous_update=False,
                               layout=widgets.Layout(width="95%"), style=_WIDE),
        "temperature": slider(widgets.FloatSlider, temperature, 0.0, 5.0, 0.05, "temperature T (0 = greedy)", ".2f"),
        "top_k": slider(widgets.IntSlider, top_k, 0, vocab, 1, "top-k (0 = off)"),
        "top_p": slider(widgets.FloatSlider, top_p, 0.01, 1.0, 0.01, "top-p (1 = off)", ".2f"),
        "min_p": slider(widgets.FloatSlider, min_p, 0.0, 1.0, 0.05, "min-p (0 = off)", ".2f"),
        "repetition_penalty": slider(widgets.FloatSlider, repetition_penalty, 0.1, 3.0, 0.05,
                                     "repetition penalty θ (1 = off)", ".2f"),
        "frequency_penalty": slider(widgets.FloatSlider, frequency_penalty, -2.0, 2.0, 0.1,
                                    "frequency penalty (0 = off)", ".1f"),
        "presence_penalty": slider(widgets.FloatSlider, presence_penalty, -2.0, 2.0, 0.1,
                                   "presence penalty (0 = off)", ".1f"),
        "seed": slider(widgets.IntSlider, seed, 0, 99, 1, "seed"),
        "max_new_tokens": slider(widgets.IntSlider, max_new_tokens, 1, 60, 1, "new tokens"),
        "samples": widgets.Button(description=f"{n_samples} samples", icon="random", button_style="info"),
    }
    stats = widgets.HTML()
    continuation = widgets.HTML()
    output = widgets.Output(layout=widgets.Layout(max_height="420px", overflow="auto"))
    figure = go.FigureWidget(filter_figure(["…"] * top_n, [0.0] * top_n, [0.0] * top_n, [""] * top_n))

    def params() -> SamplingParams:
        c = controls
        return SamplingParams(temperature=float(c["temperature"].value), top_k=int(c["top_k"].value),
                              top_p=float(c["top_p"].value), min_p=float(c["min_p"].value),
                              repetition_penalty=float(c["repetition_penalty"].value),
                              frequency_penalty=float(c["frequency_penalty"].value),
                              presence_penalty=float(c["presence_penalty"].value),
                              max_tokens=int(c["max_new_tokens"].value), seed=int(c["seed"].value))

    def update(*_):
        sp = params()
        try:
            ids, logits = cache.get(controls["prompt"].value, reserve=sp.max_tokens)
        except (TypeError, ValueError) as err:
            stats.value, continuation.value = _error_html(err), ""
            return
        trace = trace_filters(logits, sp, prev_ids=ids, prompt_lens=len(ids))
        top = torch.topk(trace.base_probs, top_n).indices.tolist()
        _refresh(figure, filter_figure(_labels(lm, top), trace.base_probs[top].tolist(),
                                       trace.final_probs[top].tolist(), [trace.reason[i] for i in top]))
        cut = Counter(r for r in trace.reason if r)
        cut_text = ", ".join(f"{n:,} by {name}" for name, n in cut.items()) or "none"
        stats.value = (_stat("candidates kept", f"{trace.num_kept:,} of {len(trace.reason):,}")
                       + _stat("cut", cut_text)
                       + _stat("entropy before the cut", f"{float(entropy_bits(trace.base_probs)):.2f} bits"))
        result = generate(lm, ids, sp)                         # seeded by sp.seed: same sliders, same text
        bits = log2_prob(result.logprob)
        continuation.value = (
            f"<div style='font-size:17px;line-height:1.5'><span style='color:#777'>"
            f"{html.escape(lm.decode(ids[-30:]))}</span><b style='color:#1f4e9c'>{html.escape(result.text)}</b></div>"
            f"<div style='font-size:14px;color:#555'>seed {sp.seed}, {len(result.token_ids)} tokens, finish reason "
            f"“{result.finish_reason}”, Σ log₂ p under the model = {bits:.1f} bits</div>")

    def samples(*_):
        sp = params()
        try:
            ids, _ = cache.get(controls["prompt"].value, reserve=sp.max_tokens)
        except (TypeError, ValueError) as err:
            output.outputs = ()
            output.append_display_data(HTML(_error_html(err)))
            return
        gen = torch.Generator(device=lm.device).manual_seed(sp.seed)
        results = generate_batch(lm, [ids] * n_samples, sp, generator=gen)
        output.outputs = ()
        output.append_display_data(HTML(_samples_html([r.text for r in results], [r.token_ids[0] for r in results],
                                                      lm.decode(ids[-12:]), sp.seed)))

    for name, control in controls.items():
        if name == "samples":
            control.on_click(samples)
        else:
            control.observe(update, names="value")
    update()
    left = widgets.VBox([controls[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed")],
                        layout=widgets.Layout(width="50%"))
    right = widgets.VBox([controls[k] for k in ("repetition_penalty", "frequency_penalty", "presence_penalty",
                                                "max_new_tokens", "samples")], layout=widgets.Layout(width="50%"))
    box = widgets.VBox([controls["prompt"], widgets.HBox([left, right]), stats, figure, continuation, output])
    box.controls, box.figure, box.update, box.cache = controls, figure, update, cache
    box.samples, box.output, box.stats, box.continuation = samples, output, stats, continuation
    return box
