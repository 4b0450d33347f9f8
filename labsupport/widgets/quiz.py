"""The quiz panel: each question with its buttons or number box, ✓/✗ and the explanation.

Thin wiring over :mod:`labsupport.quiz`: a multiple-choice question is a row of toggle buttons,
a numeric one a text box and a "check" button. Feedback appears under the question; a failure
inside a callback is shown as a red line and the panel keeps working (it never throws into the
notebook). The returned :class:`labsupport.widgets.snapshot.Panel` carries ``panel.quiz`` and
``panel.submit(i, value)`` (what a click does, callable directly).
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from labsupport.i18n import tr
from labsupport.quiz import RIGHT, WRONG, MultipleChoice, Numeric, Predict, Quiz
from labsupport.widgets.snapshot import Panel


def _feedback(ok: bool, text: str) -> str:
    colour = "#1b7f3b" if ok else "#b00020"
    return (f"<div style='font-size:16px;color:{colour};margin:2px 0 8px 0'><b>{RIGHT if ok else WRONG}</b> "
            f"{html.escape(text)}</div>")


def quiz_panel(quiz: Quiz | list) -> Panel:
    """A panel for ``quiz`` (a :class:`Quiz` or a list of questions).

    Raises:
        TypeError / ValueError: as :class:`labsupport.quiz.Quiz` for a badly built quiz.
    """
    quiz = quiz if isinstance(quiz, Quiz) else Quiz(quiz)
    feedback = [widgets.HTML() for _ in quiz.questions]
    rows: list[widgets.Widget] = [widgets.HTML(f"<h3 style='margin:4px 0'>{html.escape(quiz.title)}</h3>")]
    score = widgets.HTML()
    results: dict[int, bool] = {}

    def submit(i: int, value) -> tuple[bool, str]:
        try:
            ok, why = quiz.answer(i, value)
        except Exception as err:  # noqa: BLE001 - a panel never throws into the notebook
            line = feedback[i] if isinstance(i, int) and 0 <= i < len(feedback) else score
            line.value = f"<span style='color:#b00020'>⚠ {html.escape(str(err))}</span>"
            return False, str(err)
        feedback[i].value = _feedback(ok, why)
        results[i] = ok
        score.value = ("<div style='font-size:15px'>"
                       + tr("{right} of {total} right ({answered} answered)", right=sum(results.values()),
                            total=len(quiz), answered=len(results))
                       + "</div>")
        return ok, why

    for i, q in enumerate(quiz.questions):
        rows.append(widgets.HTMLMath(f"<div style='font-size:17px;margin-top:6px'><b>Q{i + 1}.</b> {q.prompt}</div>"))
        if isinstance(q, MultipleChoice):
            buttons = widgets.ToggleButtons(options=[(q.options[k], k) for k in q.display_order], value=None,
                                            style={"button_width": "auto"})
            buttons.observe(lambda ch, i=i: ch["new"] is not None and submit(i, ch["new"]), names="value")
            rows.append(buttons)
        elif isinstance(q, Numeric):
            box = widgets.Text(placeholder=tr("a number in {unit}", unit=q.unit) if q.unit else tr("a number"),
                               continuous_update=False,
                               layout=widgets.Layout(width="220px"))
            button = widgets.Button(description=tr("check"), button_style="info", layout=widgets.Layout(width="90px"))
            button.on_click(lambda _, i=i, box=box: submit(i, box.value))
            box.observe(lambda ch, i=i: ch["new"].strip() and submit(i, ch["new"]), names="value")   # Enter
            rows.append(widgets.HBox([box, button, widgets.HTML(html.escape(q.unit))]))
        rows.append(feedback[i])
    rows.append(score)
    panel = Panel(rows)
    panel.quiz, panel.submit, panel.feedback = quiz, submit, feedback
    return panel


def predict_panel(prediction: Predict) -> Panel:
    """Buttons for a :class:`~labsupport.quiz.Predict` question: a click records the prediction;
    the verdict appears here (and in the measuring cell) once that cell calls ``reveal``.

    Raises:
        TypeError: ``prediction`` is not a Predict.
    """
    from labsupport.validation import check_type

    check_type("prediction", prediction, Predict)
    note, verdict = widgets.HTML(), widgets.HTML()
    buttons = widgets.ToggleButtons(options=[(o, k) for k, o in enumerate(prediction.options)], value=None,
                                    style={"button_width": "auto"})

    def submit(value) -> str:
        try:
            text = prediction.choose(value)
        except Exception as err:  # noqa: BLE001 - a panel never throws into the notebook
            text = f"⚠ {err}"
        note.value = f"<div style='font-size:15px;color:#37474f;margin:2px 0'>{html.escape(text)}</div>"
        if prediction.verdict is None:                 # measured already (Run All): the verdict just appeared
            verdict.value = ""
        return text

    buttons.observe(lambda ch: ch["new"] is not None and submit(ch["new"]), names="value")
    def show(ok: bool, text: str) -> None:
        colour = "#37474f" if prediction.choice is None else "#1b7f3b" if ok else "#b00020"
        verdict.value = f"<div style='font-size:16px;color:{colour};margin:2px 0 8px 0'>{html.escape(text)}</div>"
        if prediction.choice is not None:              # measured: the prediction is locked, the "noted" line goes
            note.value, buttons.disabled = "", True

    prediction._listeners.append(show)
    rows = [widgets.HTML(f"<h3 style='margin:4px 0'>{tr('Predict before you run the cells below')}</h3>"),
            widgets.HTMLMath(f"<div style='font-size:17px;margin-top:6px'>{prediction.prompt}</div>"),
            buttons, note, verdict]
    panel = Panel(rows)
    panel.prediction, panel.submit = prediction, submit
    return panel
