"""Panels of chapter 01 (sampling): the temperature panel and the sampling lab.

Thin wiring only: sliders → ``labsupport.sampling`` / ``labsupport.generation`` → a figure from
``labsupport.viz.sampling`` shown in a ``FigureOutput`` (``widgets.common``), redrawn whole on every change.
Each panel computes its first state when it is built (so it shows something even where callbacks never
run, e.g. under nbval) and returns an ``ipywidgets.VBox`` that also carries, for tests and curious students:

* ``panel.controls`` – dict of the input widgets by name,
* ``panel.figure`` – the ``FigureOutput`` (its ``data`` / ``layout``: the figure shown),
* ``panel.update()`` – recompute everything from the current control values,
* ``panel.cache`` – the next-token cache (``.forwards`` counts model forwards).

The logits of the current prompt are cached: moving a slider costs a softmax over the vocabulary (and, in
the lab, one short seeded generation), never a new prompt forward.
"""

from __future__ import annotations

import html
from collections import Counter

import ipywidgets as widgets
import torch
from IPython.display import HTML

from labsupport.generation import generate, generate_batch, log2_prob, next_token_logits
from labsupport.i18n import tr
from labsupport.models import LoadedModel, max_positions
from labsupport.sampling import (
    SamplingParams,
    candidates_for_mass,
    entropy_bits,
    perplexity,
    probs_from_logits,
    trace_filters,
)
from labsupport.validation import check_int, check_real, check_type
from labsupport.viz.sampling import distribution_figure, filter_figure, filter_label, unique_labels
from labsupport.widgets.common import FigureOutput, error_html, panel_int, panel_real
from labsupport.widgets.snapshot import Panel

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


def _labels(lm: LoadedModel, ids: list[int]) -> list[str]:
    return unique_labels([lm.token_str(i) for i in ids])



def _stat(name: str, value: str) -> str:
    return (f"<div style='display:inline-block;margin:0 22px 6px 0'><div style='font-size:14px;color:#555'>"
            f"{name}</div><div style='font-size:22px;font-weight:600'>{value}</div></div>")


EDIT_RANGE = 50.0           # the edit sliders span [−50, 50]: fixed, so the browser never re-clamps a value


def temperature_panel(lm: LoadedModel, prompt: str = "Return the number of", *, temperature: float = 1.0,
                      top_n: int = 20, shift: float = 10.0, edit_n: int = 2) -> widgets.VBox:
    """Temperature and the next-token distribution, on the real model or on logits you edit.

    Controls: an editable prompt, a temperature slider (0 = greedy … 3), a button that adds
    ``shift`` to *every* logit and one that resets it, and a mode switch:

    * **real model** — the logits and probabilities of the ``top_n`` most likely next tokens; maximum probability,
      entropy (bits), perplexity ``2^H`` and the candidates for 90 % of the mass, over the whole vocabulary.
    * **edit logits** — only the ``edit_n`` most likely candidates, each with a slider for its
      logit (starting at the model's value); ``p = softmax(z / T)`` over that small set. Raising
      the second logit to equal the first gives 50 % / 50 % and 1 bit of entropy.

    After a shift it also shows the largest change of any probability (zero up to float32 rounding: shift invariance).

    Args:
        lm: a loaded model (``labsupport.models.load_model``).
        prompt: the starting prompt.
        temperature: starting T, in [0, 3].
        top_n: candidates shown as bars in the real-model mode (≥ 1; at most the vocabulary).
        shift: the constant the shift button adds to all logits.
        edit_n: candidates in the edit mode, in [2, 6].

    Returns:
        The panel (``ipywidgets.VBox``) with ``controls`` (``"mode"``, ``"edit"``: the logit sliders, …),
        ``figure``, ``stats``, ``update``, ``cache``.

    Raises:
        TypeError: ``prompt`` not a str, a number that is not one.
        ValueError: ``top_n`` < 1, ``edit_n`` outside [2, 6], ``temperature`` outside [0, 3], ``shift`` not finite.
    """
    check_type("prompt", prompt, str)
    check_real("shift", shift)
    check_int("top_n", top_n, 1)
    check_int("edit_n", edit_n, 2, 6)
    check_real("temperature", temperature, 0, 3, hint=" for this panel")
    top_n, edit_n = (min(n, lm.model.config.vocab_size) for n in (top_n, edit_n))
    cache = NextTokenCache(lm)
    prompt_box = widgets.Text(value=prompt, description=tr("prompt"), continuous_update=False,
                              layout=widgets.Layout(width="95%"), style=_WIDE)
    t_slider = widgets.FloatSlider(value=temperature, min=0.0, max=3.0, step=0.05, description=tr("temperature T"),
                                   continuous_update=True, readout_format=".2f", style=_WIDE,
                                   layout=widgets.Layout(width="60%"))
    shift_button = widgets.Button(description=tr("add {shift:+g} to every logit", shift=shift), icon="plus",
                                  layout=widgets.Layout(width="auto"))
    reset_button = widgets.Button(description=tr("reset shift"), layout=widgets.Layout(width="auto"))
    mode = widgets.ToggleButtons(options=[(tr("real model"), "model"),
                                          (tr("edit logits ({n} candidates)", n=edit_n), "edit")],
                                 value="model", style={"button_width": "auto"})
    edit_sliders = [widgets.FloatSlider(value=0.0, min=-EDIT_RANGE, max=EDIT_RANGE, step=0.1, description=f"z{k + 1}",
                                        continuous_update=True, readout_format=".1f", style=_WIDE,
                                        layout=widgets.Layout(width="48%")) for k in range(edit_n)]
    edit_box = widgets.HBox(edit_sliders, layout=widgets.Layout(flex_flow="row wrap", display="none"))
    stats = widgets.HTML()
    state = {"offset": 0.0, "edit_ids": None, "edit_prompt": None, "busy": False}
    figure = FigureOutput()                         # drawn by update() below

    def load_edit_set(ids_logits) -> None:
        """Start the edit sliders at the model's logits of its ``edit_n`` most likely candidates."""
        _, logits = ids_logits
        top = torch.topk(logits, edit_n).indices.tolist()
        labels = _labels(lm, top)
        state["busy"] = True                                   # one redraw, not one per slider
        try:
            for k, (slider, i) in enumerate(zip(edit_sliders, top)):
                value = round(float(logits[i]), 1)
                if not -EDIT_RANGE <= value <= EDIT_RANGE:
                    raise ValueError(f"logit {value:g} of {labels[k]!r} is outside the edit sliders' range "
                                     f"[{-EDIT_RANGE:g}, {EDIT_RANGE:g}]; use the real-model mode for this prompt")
                slider.value = value
                slider.description = f"z({labels[k]})"
            state["edit_ids"], state["edit_prompt"] = top, prompt_box.value
        finally:
            state["busy"] = False

    def update(*_):
        if state["busy"]:
            return
        try:
            ids_logits = cache.get(prompt_box.value)
        except (TypeError, ValueError) as err:
            stats.value = error_html(err)
            return
        try:
            ids, logits = ids_logits
            t = float(t_slider.value)
            params = SamplingParams(temperature=t)
            editing = mode.value == "edit"
            edit_box.layout.display = "flex" if editing else "none"
            if editing:
                if state["edit_ids"] is None or state["edit_prompt"] != prompt_box.value:
                    load_edit_set(ids_logits)
                top = state["edit_ids"]
                base = torch.tensor([float(s.value) for s in edit_sliders])      # (edit_n,) edited logits
                z, p = base + state["offset"], probs_from_logits(base + state["offset"], params)
                p_unshifted = probs_from_logits(base, params)
                bars_z, bars_p = z.tolist(), p.tolist()
                entropy_name = tr("entropy H (over these {n} candidates only)", n=edit_n)
            else:
                z = logits + state["offset"]                           # (vocab,) shifted logits
                p = probs_from_logits(z, params)                       # (vocab,) over the whole vocabulary
                p_unshifted = probs_from_logits(logits, params)
                top = torch.topk(logits, top_n).indices.tolist()       # order does not depend on T or shift
                bars_z, bars_p = z[top].tolist(), p[top].tolist()
                entropy_name = tr("entropy H (over all {n:,} tokens)", n=p.numel())
            order = sorted(range(len(top)), key=lambda k: -bars_z[k]) if editing else list(range(len(top)))
            labels = _labels(lm, top)
            fresh = distribution_figure([labels[k] for k in order], [bars_z[k] for k in order],
                                        [bars_p[k] for k in order])
            fresh.layout.yaxis.title.text = (tr("{n} candidates (edited)", n=edit_n) if editing
                                             else tr("top {n} next tokens", n=top_n))
            fresh.layout.xaxis2.title.text = (tr("probability p at T = {t:g} (greedy)", t=t) if t == 0
                                              else tr("probability p at T = {t:g}", t=t))
            fresh.layout.title.text = tr("Next token after “{prompt}”", prompt=html.escape(prompt_box.value[-40:]))
            figure.show(fresh)
            h = max(0.0, float(entropy_bits(p)))
            parts = [_stat(tr("max probability"), f"{100 * float(p.max()):.1f} %"),
                     _stat(entropy_name, tr("{h:.2f} bits", h=h)),
                     _stat(tr("perplexity 2<sup>H</sup>"), f"{float(perplexity(p)):.2f}" if editing
                           else f"{float(perplexity(p)):.1f}"),
                     _stat(tr("candidates for 90 %"), tr("{k:,} of {n:,}", k=candidates_for_mass(p, 0.9), n=p.numel()))]
            if state["offset"]:
                dp = float((p - p_unshifted).abs().max())
                parts.append(_stat(tr("logits shifted by {offset:+g}: max |Δp|", offset=state["offset"]), f"{dp:.1e}"))
            if cache.truncated:
                parts.append(f"<div>{tr('(prompt cut to its last {n} tokens)', n=len(ids))}</div>")
            stats.value = "".join(parts)
        except Exception as err:  # noqa: BLE001 - a panel never throws into the notebook
            stats.value = error_html(err)

    def on_shift(_):
        state["offset"] += shift
        update()

    def on_reset(_):
        state["offset"] = 0.0
        if mode.value == "edit":
            state["edit_ids"] = None                              # back to the model's logits
        update()

    prompt_box.observe(update, names="value")
    t_slider.observe(update, names="value")
    mode.observe(update, names="value")
    for slider in edit_sliders:
        slider.observe(update, names="value")
    shift_button.on_click(on_shift)
    reset_button.on_click(on_reset)
    update()
    box = Panel([prompt_box, widgets.HBox([t_slider, shift_button, reset_button]), mode, edit_box, stats, figure])
    box.controls = {"prompt": prompt_box, "temperature": t_slider, "shift": shift_button, "reset": reset_button,
                    "mode": mode, "edit": edit_sliders}
    box.figure, box.stats, box.update, box.cache = figure, stats, update, cache
    return box


def _samples_html(texts: list[str], first_ids: list[int], prompt_tail: str, seed: int) -> str:
    counts = Counter(texts)
    rows = "".join(
        f"<tr><td style='text-align:right;padding:2px 10px'>{c}×</td>"
        f"<td style='white-space:pre-wrap;text-align:left;padding:2px 6px'><span style='color:#777'>…{html.escape(prompt_tail)}</span>"
        f"<b>{html.escape(t)}</b></td></tr>" for t, c in counts.most_common())
    head = tr("<b>{n} samples</b> (one generator seeded with {seed}): <b>{distinct} distinct</b> continuations, "
              "{first} distinct first tokens.", n=len(texts), seed=seed, distinct=len(counts),
              first=len(set(first_ids)))
    return (f"<div style='font-size:16px'>{head}"
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
        TypeError: ``prompt`` not a str; ValueError: a starting value outside its range.
    """
    check_type("prompt", prompt, str)
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
        "prompt": widgets.Text(value=prompt, description=tr("prompt"), continuous_update=False,
                               layout=widgets.Layout(width="95%"), style=_WIDE),
        "temperature": slider(widgets.FloatSlider, temperature, 0.0, 5.0, 0.05, tr("temperature T (0 = greedy)"),
                              ".2f"),
        "top_k": slider(widgets.IntSlider, top_k, 0, vocab, 1, tr("top-k (0 = off)")),
        "top_p": slider(widgets.FloatSlider, top_p, 0.01, 1.0, 0.01, tr("top-p (1 = off)"), ".2f"),
        "min_p": slider(widgets.FloatSlider, min_p, 0.0, 1.0, 0.05, tr("min-p (0 = off)"), ".2f"),
        "repetition_penalty": slider(widgets.FloatSlider, repetition_penalty, 0.1, 3.0, 0.05,
                                     tr("repetition penalty θ (1 = off)"), ".2f"),
        "frequency_penalty": slider(widgets.FloatSlider, frequency_penalty, -2.0, 2.0, 0.1,
                                    tr("frequency penalty (0 = off)"), ".1f"),
        "presence_penalty": slider(widgets.FloatSlider, presence_penalty, -2.0, 2.0, 0.1,
                                   tr("presence penalty (0 = off)"), ".1f"),
        "seed": slider(widgets.IntSlider, seed, 0, 99, 1, tr("seed")),
        "max_new_tokens": slider(widgets.IntSlider, max_new_tokens, 1, 60, 1, tr("new tokens")),
        "samples": widgets.Button(description=tr("{n} samples", n=n_samples), icon="random", button_style="info"),
    }
    stats = widgets.HTML()
    continuation = widgets.HTML()
    output = widgets.Output(layout=widgets.Layout(max_height="420px", overflow="auto"))
    figure = FigureOutput()                         # drawn by update() below

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
            stats.value, continuation.value = error_html(err), ""
            return
        trace = trace_filters(logits, sp, prev_ids=ids, prompt_lens=len(ids))
        top = torch.topk(trace.base_probs, top_n).indices.tolist()
        fresh = filter_figure(_labels(lm, top), trace.base_probs[top].tolist(),
                              trace.final_probs[top].tolist(), [trace.reason[i] for i in top])
        figure.show(fresh)
        cut = Counter(r for r in trace.reason if r)
        cut_text = ", ".join(tr("{n:,} by {name}", n=n, name=filter_label(name)) for name, n in cut.items()) or tr("none")
        stats.value = (_stat(tr("candidates kept"), tr("{k:,} of {n:,}", k=trace.num_kept, n=len(trace.reason)))
                       + _stat(tr("cut"), cut_text)
                       + _stat(tr("entropy before the cut"), tr("{h:.2f} bits", h=float(entropy_bits(trace.base_probs)))))
        result = generate(lm, ids, sp)                         # seeded by sp.seed: same sliders, same text
        bits = log2_prob(result.logprob)
        continuation.value = (
            f"<div style='font-size:17px;line-height:1.5'><span style='color:#777'>"
            f"{html.escape(lm.decode(ids[-30:]))}</span><b style='color:#1f4e9c'>{html.escape(result.text)}</b></div>"
            "<div style='font-size:14px;color:#555'>"
            + tr("seed {seed}, {n} tokens, finish reason “{reason}”, Σ log₂ p under the model = {bits:.1f} bits",
                 seed=sp.seed, n=len(result.token_ids), reason=result.finish_reason, bits=bits)
            + "</div>")

    def samples(*_):
        sp = params()
        try:
            ids, _ = cache.get(controls["prompt"].value, reserve=sp.max_tokens)
        except (TypeError, ValueError) as err:
            output.outputs = ()
            output.append_display_data(HTML(error_html(err)))
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
    box = Panel([controls["prompt"], widgets.HBox([left, right]), stats, figure, continuation, output])
    box.controls, box.figure, box.update, box.cache = controls, figure, update, cache
    box.samples, box.output, box.stats, box.continuation = samples, output, stats, continuation
    return box
