"""Panel of chapter 08 (structured output): drive the real model token by token, grammar on/off.

Thin wiring: the model's next-token logits (``labsupport.generation.next_token_logits``), the
compiled grammar (``labsupport.structured``) and the masked sampler (``labsupport.sampling``)
feed ``labsupport.viz.structured.masked_candidates_figure``. The panel computes its first
state when built and returns an ``ipywidgets.VBox`` carrying ``controls`` (dict of widgets),
``figure``, ``stats``, ``update()``, ``force(token_id)``, ``force_text(text)``,
``sample_next()``, ``complete()``, ``reset()`` and ``state`` (the output so far). An error in
a callback is shown as a red line in the panel, never raised into the notebook.
"""

from __future__ import annotations

import html
import json
import re
import time

import ipywidgets as widgets
import torch

from labsupport.generation import next_token_logits
from labsupport.i18n import tr
from labsupport.models import LoadedModel, max_positions
from labsupport.sampling import SamplingParams, probs_from_logits, sample
from labsupport.structured import for_model, normalize_spec
from labsupport.validation import check_int, check_real, check_type
from labsupport.viz.structured import masked_candidates_figure, pick_candidates

from .common import error_html
from .snapshot import Panel
from .speculative import FigureOutput

_WIDE = {"description_width": "initial"}




def _only(n: int) -> str:
    """``"only 1 token is"`` / ``"only 3 tokens are"``."""
    return f"only {n:,} token is" if n == 1 else f"only {n:,} tokens are"


def done_figure(num_tokens: int):
    """The candidates chart once EOS ended the output: nothing is sampled any more."""
    import plotly.graph_objects as go

    from labsupport.viz.style import style
    fig = go.Figure()
    done = (tr("output complete: EOS after {n} token — press reset to start again", n=num_tokens) if num_tokens == 1
            else tr("output complete: EOS after {n} tokens — press reset to start again", n=num_tokens))
    fig.add_annotation(text=done, showarrow=False, x=0.5, y=0.5, xref="paper",
                       yref="paper", font={"size": 18})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return style(fig, tr("No more candidates: the grammar's output is complete"), 380)

def _stat(name: str, value: str) -> str:
    return (f"<div style='display:inline-block;margin:0 22px 6px 0'><div style='font-size:14px;color:#555'>"
            f"{name}</div><div style='font-size:20px;font-weight:600'>{value}</div></div>")


def parse_result(text: str, spec: dict, grammar_state: int | None, grammar) -> str:
    """A short verdict on ``text``: valid, a valid prefix, or invalid (with the reason)."""
    from labsupport.bench.structured import GRAMMAR_CHECKS, load_jsonschema  # independent checkers
    jsonschema = load_jsonschema()
    kind, payload, _ = normalize_spec(spec)
    if kind == "json":
        try:
            jsonschema.validate(json.loads(text), payload)
            return tr("valid JSON, matches the schema ✓")
        except json.JSONDecodeError as err:                    # the libraries' own words stay English
            reason = tr("does not parse yet ({error})", error=err.msg)
        except jsonschema.ValidationError as err:
            reason = tr("parses, but {error}", error=err.message)
    elif kind == "grammar":
        if GRAMMAR_CHECKS.get(payload, grammar.matches)(text):
            return tr("matches ✓")
        reason = tr("does not match")
    elif (re.fullmatch(payload, text) if kind == "regex" else text in payload):
        return tr("matches ✓")
    else:
        reason = tr("does not match")
    if grammar_state is not None and not grammar.is_accepting(grammar_state):
        return tr("incomplete: a valid prefix — {reason}", reason=reason)
    return tr("invalid — {reason}", reason=reason)


def _stack_text(grammar, state: int) -> str:
    """The pushdown state's stacks as rule names: the first in full, then how many more."""
    stacks = grammar.stacks(state)
    first = " › ".join(stacks[0]) if stacks else "—"
    more = tr(" (+{n} more stacks)", n=len(stacks) - 1) if len(stacks) > 1 else ""
    n = len(stacks[0]) if stacks else 0
    depth = tr(" — 1 frame") if n == 1 else tr(" — {n} frames", n=n)
    return f"<span style='font-size:14px;font-weight:400'>{html.escape(first + more + depth)}</span>"


def structured_lab(lm: LoadedModel, spec: dict, prompt: str = "Answer in JSON: ", *, temperature: float = 1.0,
                   seed: int = 0, top_n: int = 8, max_complete: int = 60,
                   example: str = '{"name":"Ann","name"') -> widgets.VBox:
    """Toggle the grammar, press a candidate chip to force a token, watch the grammar state.

    Shows the ``top_n`` most likely next tokens (grey: the model; blue: after the grammar's
    mask, renormalised; red label: refused, probability exactly 0), chips for the candidates
    that may be chosen, the grammar state, the number of allowed tokens, the time of the mask
    look-up, the text so far and whether it parses and validates; for a grammar with recursion
    (the pushdown path) also the stack of rules. A text box forces a whole string token by
    token and reports the first token the grammar refuses (try writing a key twice).

    Args:
        lm: a loaded model.
        spec: a structured-output spec (``{"json": schema}``, ``{"regex": ...}``, ``{"choice": [...]}``,
            ``{"grammar": ebnf}``).
        prompt: the prompt before the output.
        temperature: sampling temperature in [0, 2] (0 = greedy).
        seed: seed in [0, 99] of the sampling generator.
        top_n: candidates shown, in [2, 16].
        max_complete: most tokens the "complete" button adds, in [1, 200].
        example: the text box's hint, a text to force after reset.

    Raises:
        TypeError / ValueError: a bad spec or a starting value outside its range.
    """
    normalize_spec(spec)
    temperature = check_real("temperature", temperature, 0.0, 2.0)
    seed = check_int("seed", seed, 0, 99)
    top_n = check_int("top_n", top_n, 2, 16)
    max_complete = check_int("max_complete", max_complete, 1, 200)
    example = check_type("example", example, str)
    grammar = for_model(spec, lm)
    prompt_ids = lm.encode(prompt)
    if not prompt_ids:
        raise ValueError("prompt must contain at least one token, got an empty prompt")
    state = {"out": [], "gstate": grammar.initial_state(), "done": False, "note": "", "mask_us": 0.0,
             "gen": torch.Generator().manual_seed(seed)}
    controls = {
        "grammar": widgets.ToggleButton(value=True, description=tr("grammar ON"), icon="check", button_style="success"),
        "temperature": widgets.FloatSlider(value=temperature, min=0.0, max=2.0, step=0.05, style=_WIDE,
                                           description=tr("temperature T (0 = greedy)"), continuous_update=False,
                                           layout=widgets.Layout(width="460px")),
        "seed": widgets.IntSlider(value=seed, min=0, max=99, description=tr("seed"), style=_WIDE,
                                  continuous_update=False),
        "sample": widgets.Button(description=tr("sample next token"), icon="step-forward",
                                 layout=widgets.Layout(width="190px")),
        "complete": widgets.Button(description=tr("complete"), icon="fast-forward",
                                   tooltip=tr("sample up to {n} tokens, until EOS", n=max_complete)),
        "undo": widgets.Button(description=tr("undo"), icon="undo"),
        "reset": widgets.Button(description=tr("reset"), icon="refresh"),
        "text": widgets.Text(value="", placeholder=tr("after reset, e.g. {example}", example=example),
                             description=tr("force text"), style=_WIDE, layout=widgets.Layout(width="60%")),
        "force_text": widgets.Button(description=tr("force this text"), icon="keyboard-o"),
    }
    chip_pool = [widgets.Button(layout=widgets.Layout(width="auto")) for _ in range(top_n)]
    for b in chip_pool:
        b.token = None
        b.on_click(lambda button: force(button.token) if button.token is not None else None)
    chips = widgets.HBox(chip_pool, layout=widgets.Layout(flex_flow="row wrap"))
    stats, output_html, note = widgets.HTML(), widgets.HTML(), widgets.HTML()
    figure = FigureOutput()            # a plain plotly output redrawn whole: a FigureWidget rendered as empty axes

    def params() -> SamplingParams:
        return SamplingParams(temperature=float(controls["temperature"].value))

    def current():
        """(logits, mask or None) for the next token."""
        ids = (prompt_ids + state["out"])[-max_positions(lm.model):]
        logits = next_token_logits(lm, ids)
        mask = None
        if controls["grammar"].value and state["gstate"] is not None:
            start = time.perf_counter()
            mask = grammar.allowed_token_mask(state["gstate"])
            state["mask_us"] = (time.perf_counter() - start) * 1e6
        return logits, mask

    def append(token: int) -> None:
        state["out"].append(int(token))
        if token == lm.eos_token_id:
            state["done"] = True
        if state["gstate"] is not None:
            try:
                state["gstate"] = grammar.advance(state["gstate"], int(token))
            except ValueError:
                state["gstate"] = None                         # the output left the language

    def update(*_):
        try:
            _update()
        except Exception as err:  # noqa: BLE001 - a panel shows its errors, it never raises
            note.value = error_html(err)

    def _update():
        on = controls["grammar"].value
        controls["grammar"].description = tr("grammar ON") if on else tr("grammar OFF")
        controls["grammar"].button_style = "success" if on else ""
        text = lm.decode([t for t in state["out"] if t != lm.eos_token_id])
        g = state["gstate"]
        logits, mask = current() if not state["done"] else (None, None)
        allowed_n = grammar.num_allowed(g) if g is not None else 0
        output_html.value = (f"<div style='font-size:17px;font-family:monospace;white-space:pre-wrap'>"
                             f"<span style='color:#777'>{html.escape(prompt[-80:])}</span>"
                             f"<b style='color:#1f4e9c'>{html.escape(text)}</b>"
                             f"{'<span style=color:#2ca02c> ⟨EOS⟩</span>' if state['done'] else ''}</div>")
        stats.value = (_stat(tr("grammar state"), tr("left the grammar ✗") if g is None else
                             tr("{state} (accepting)", state=g) if grammar.is_accepting(g) else f"{g}")
                       + _stat(tr("allowed next tokens"), tr("{allowed:,} of {vocab:,}", allowed=allowed_n,
                                                             vocab=grammar.vocab_size))
                       + (_stat(tr("stack (bottom › top)"), _stack_text(grammar, g))
                          if hasattr(grammar, "stacks") and g is not None else "")
                       + _stat(tr("mask look-up"), f"{state['mask_us']:.0f} µs")
                       + _stat(tr("parse result"), html.escape(parse_result(text, spec, g, grammar))))
        if state["done"]:
            for b in chip_pool:
                b.token, b.layout.display = None, "none"
            figure.show(done_figure(len(state["out"])))          # not the last step's candidates any more
            return
        model_p = torch.softmax(logits, dim=-1)
        final_p = probs_from_logits(logits, params(), allowed=mask)
        top = pick_candidates(model_p.tolist(), final_p.tolist(), top_n)   # allowed and refused ones
        ok = [True] * top_n if mask is None else [bool(mask[i]) for i in top]
        fresh = masked_candidates_figure([lm.token_str(i) for i in top], model_p[top].tolist(),
                                         final_p[top].tolist(), ok)
        figure.show(fresh)
        choose = [t for t in torch.topk(final_p, top_n).indices.tolist() if final_p[t] > 0]
        for k, b in enumerate(chip_pool):                       # a fixed pool: no widget churn
            if k < len(choose):
                tok = choose[k]
                b.token = tok
                b.description = f"{lm.token_str(tok)}  {100 * float(final_p[tok]):.0f}%"
                b.button_style = "success" if tok == lm.eos_token_id else "info"
                b.layout.display = None
            else:
                b.token = None
                b.layout.display = "none"

    def act(fn):
        def run(*_):
            note.value = ""
            try:
                fn()
            except Exception as err:  # noqa: BLE001
                note.value = error_html(err)
            update()
        return run

    def force(token: int) -> None:
        note.value = ""
        if not state["done"]:
            append(token)
        update()

    def sample_next() -> None:
        if state["done"]:
            return
        logits, mask = current()
        append(int(sample(logits, params(), state["gen"], allowed=mask)))

    def complete() -> None:
        for _ in range(max_complete):
            if state["done"] or len(prompt_ids) + len(state["out"]) >= max_positions(lm.model):
                break
            sample_next()

    def force_text(text: str | None = None) -> None:
        text = controls["text"].value if text is None else text
        added = 0
        for tok in lm.encode(text):
            g = state["gstate"]
            if controls["grammar"].value and g is not None and not grammar.allowed_token_mask(g)[tok]:
                n, shown = grammar.num_allowed(g), html.escape(lm.token_str(tok))
                refused = (tr("refused by the grammar: token “{token}” (only {n:,} token is allowed here)",
                              token=shown, n=n) if n == 1 else
                           tr("refused by the grammar: token “{token}” (only {n:,} tokens are allowed here)",
                              token=shown, n=n))
                if added:
                    rest = (tr("the 1 token before it was added, it and the rest were not") if added == 1 else
                            tr("the {n} tokens before it were added, it and the rest were not", n=added))
                elif state["out"]:
                    rest = tr("nothing was added (forced text continues the output so far: "
                              "press reset to start from the prompt)")
                else:
                    rest = tr("nothing was added")
                note.value = f"<div style='color:#b35900;font-size:16px'>{refused}; {rest}</div>"
                return
            append(tok)
            added += 1

    def reset() -> None:
        state.update(out=[], gstate=grammar.initial_state(), done=False,
                     gen=torch.Generator().manual_seed(int(controls["seed"].value)))

    def undo() -> None:
        if state["out"]:
            state["out"].pop()
            state["done"] = False
            try:
                state["gstate"] = grammar.state_after(state["out"])
            except ValueError:
                state["gstate"] = None

    def on_force_text(*_):
        note.value = ""
        try:
            force_text()
        except Exception as err:  # noqa: BLE001
            note.value = error_html(err)
        _update_keep_note()

    def _update_keep_note():
        kept = note.value
        update()
        if not note.value:
            note.value = kept

    controls["grammar"].observe(update, names="value")
    controls["temperature"].observe(update, names="value")
    controls["seed"].observe(act(reset), names="value")
    controls["sample"].on_click(act(sample_next))
    controls["complete"].on_click(act(complete))
    controls["undo"].on_click(act(undo))
    controls["reset"].on_click(act(reset))
    controls["force_text"].on_click(on_force_text)
    update()
    row1 = widgets.HBox([controls["grammar"], controls["temperature"], controls["seed"]])
    row2 = widgets.HBox([controls[k] for k in ("sample", "complete", "undo", "reset")])
    row3 = widgets.HBox([controls["text"], controls["force_text"]])
    box = Panel([row1, row2, output_html, stats, note, widgets.HTML(tr("<b>candidates</b> (press to force):")),
                        chips, row3, figure])
    box.controls, box.figure, box.stats, box.note, box.chips, box.update = controls, figure, stats, note, chips, update
    box.force, box.force_text, box.sample_next, box.complete, box.reset, box.undo = (
        force, force_text, sample_next, complete, reset, undo)
    box.state, box.grammar = state, grammar
    return box
