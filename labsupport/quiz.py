"""Auto-checked quiz questions: multiple choice and numeric answers with a tolerance.

Each question's ``check(answer)`` returns ``(ok, explanation)`` and never raises for a bad
answer (a wrong type or an empty answer is a wrong answer with a message saying what to give);
it raises only when the *question* is built wrong (``TypeError`` / ``ValueError`` from the
constructor, through ``labsupport.validation``). ``labsupport.widgets.quiz.quiz_panel`` shows the
same questions with buttons; ``Quiz.answer(i, value)`` and ``Quiz.report(answers)`` are the plain
function calls that nbval runs.

The right answers of numeric questions are meant to be *computed* by ``labsupport`` (e.g.
``kv.kv_bytes_per_token``), not typed in, so a quiz never drifts from the code it teaches.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from labsupport.i18n import tr
from labsupport.validation import check_int, check_real, check_type, is_int

RIGHT, WRONG = "✓", "✗"


@dataclass(frozen=True)
class MultipleChoice:
    """One question with ``options``; ``answer`` is the index (0-based) of the right option.

    ``why_not`` optionally maps a wrong option's index to a sentence on why it is wrong.

    Raises:
        TypeError: ``prompt``/``explanation`` not strings, ``options`` not strings, ``answer`` not an int.
        ValueError: fewer than two options, or ``answer`` not an option's index.
    """

    prompt: str
    options: Sequence[str]
    answer: int
    explanation: str
    why_not: dict[int, str] = field(default_factory=dict)

    def __post_init__(self):
        check_type("prompt", self.prompt, str)
        check_type("explanation", self.explanation, str)
        if isinstance(self.options, str) or len(self.options) < 2:
            raise ValueError(f"options must be a sequence of at least 2 strings, got {self.options!r}")
        for o in self.options:
            check_type("option", o, str)
        check_int("answer", self.answer, 0, len(self.options) - 1)
        for k in self.why_not:
            check_int("why_not key", k, 0, len(self.options) - 1)

    @property
    def display_order(self) -> list[int]:
        """The option indices in the order a panel shows them: a shuffle seeded by the prompt's text,
        so the right answer's place tells nothing (as written, it was most often second) and the
        order is the same on every run. ``answer`` and :meth:`check` keep the written indices."""
        seed = int.from_bytes(hashlib.sha256(self.prompt.encode("utf-8")).digest()[:8], "big")
        order = list(range(len(self.options)))
        random.Random(seed).shuffle(order)
        return order

    def check(self, answer) -> tuple[bool, str]:
        """``answer``: an option index (int) or the option's text. Returns ``(ok, explanation)``."""
        if isinstance(answer, str) and answer in self.options:
            answer = list(self.options).index(answer)
        if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(self.options):
            return False, tr("choose one of the options 0–{last} (got {answer!r})", last=len(self.options) - 1,
                             answer=answer)
        if answer == self.answer:
            return True, self.explanation
        if answer in self.why_not:
            return False, self.why_not[answer]
        return False, tr("not this one — think again about what the question asks")


@dataclass(frozen=True)
class Numeric:
    """A question answered by a number; right when within ``rel_tol`` (relative) or ``abs_tol``.

    ``unit`` is shown after the number (e.g. ``"tokens/s"``); ``hint`` is shown on a wrong answer,
    and never the answer itself.

    Raises:
        TypeError: non-string text, non-number ``answer`` or tolerances.
        ValueError: non-finite ``answer``, negative tolerances, or both tolerances zero.
    """

    prompt: str
    answer: float
    explanation: str
    rel_tol: float = 0.02
    abs_tol: float = 0.0
    unit: str = ""
    hint: str = ""

    def __post_init__(self):
        for name in ("prompt", "explanation", "unit", "hint"):
            check_type(name, getattr(self, name), str)
        check_real("answer", self.answer)
        check_real("rel_tol", self.rel_tol, 0.0)
        check_real("abs_tol", self.abs_tol, 0.0)
        if self.rel_tol == 0 and self.abs_tol == 0:
            raise ValueError("rel_tol and abs_tol are both 0: give a tolerance (rel_tol=0.02 means ±2 %)")

    def check(self, answer) -> tuple[bool, str]:
        """``answer``: a number or a string holding one (``"2.73"``, ``"1,234"``). Returns ``(ok, explanation)``."""
        value = answer
        if isinstance(answer, str):
            try:
                value = float(answer.replace(",", "").replace("_", "").strip())
            except ValueError:
                return False, (tr("give a number in {unit} (got {answer!r})", unit=self.unit, answer=answer)
                               if self.unit else tr("give a number (got {answer!r})", answer=answer))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            return False, (tr("give a finite number in {unit} (got {answer!r})", unit=self.unit, answer=answer)
                           if self.unit else tr("give a finite number (got {answer!r})", answer=answer))
        if math.isclose(float(value), self.answer, rel_tol=self.rel_tol, abs_tol=self.abs_tol):
            return True, self.explanation
        if value > self.answer:
            return False, (tr("{value:g} is too high. Hint: {hint}", value=value, hint=self.hint) if self.hint
                           else tr("{value:g} is too high.", value=value))
        return False, (tr("{value:g} is too low. Hint: {hint}", value=value, hint=self.hint) if self.hint
                       else tr("{value:g} is too low.", value=value))


Question = MultipleChoice | Numeric


class Predict:
    """A question asked *before* a measurement, answered by the measurement itself.

    The student picks an option first (``choose``, or a button of
    :func:`labsupport.widgets.quiz.predict_panel`); the cell that measures then calls
    ``reveal(answer, measured)`` with the option the run's numbers select, and the verdict
    compares the two. The right answer is never typed into the chapter: it is computed from this
    run, so it holds on any machine.

    Args:
        prompt: the question. options: at least two, e.g. ranges of the quantity to be measured.

    Raises:
        TypeError: a non-string prompt, ``options`` not a list or tuple of strings.
        ValueError: fewer than two options, an empty or repeated option.
    """

    def __init__(self, prompt: str, options: Sequence[str]):
        self.prompt = check_type("prompt", prompt, str)
        if not isinstance(options, (list, tuple)):
            raise TypeError(f"options must be a list or tuple of strings (their order is the buttons'), got {options!r}")
        if len(options) < 2:
            raise ValueError(f"options must hold at least 2 strings, got {options!r}")
        self.options = [check_type("option", o, str) for o in options]
        if any(not o.strip() for o in self.options) or len(set(self.options)) != len(self.options):
            raise ValueError(f"options must be distinct, non-empty strings, got {options!r}")
        self.choice: int | None = None
        self.verdict: str | None = None
        self._measured: tuple[int, str] | None = None    # a measurement made before any prediction (Run All)
        self._listeners: list = []

    def choose(self, value) -> str:
        """Record the prediction (an option index or its text); returns what the panel shows."""
        if isinstance(value, str) and value in self.options:
            value = self.options.index(value)
        if not is_int(value) or not 0 <= value < len(self.options):
            return tr("choose one of the options 0–{last} (got {answer!r})", last=len(self.options) - 1, answer=value)
        if self.verdict is not None and self.choice is not None:      # measured already: the first prediction stands
            return tr("the measurement is in: your prediction “{choice}” stands (see the verdict)",
                      choice=self.options[self.choice])
        self.choice, self.verdict = int(value), None
        if self._measured is not None:                              # measured first (Run All): judge at once
            self._judge(*self._measured)
            return tr("noted: “{choice}”. The measurement was already made: the verdict is below.",
                      choice=self.options[value])
        return tr("noted: “{choice}”. Now run the cells below: the measurement reveals the answer.",
                  choice=self.options[value])

    def reveal(self, answer: int, measured: str) -> str:
        """The measurement's verdict: ``answer`` is the option this run's numbers select and
        ``measured`` says what was measured. Returns the line to print (and shows it in the panel).

        Before any prediction (a student who ran all cells first) the answer stays hidden: the
        line asks for a prediction, and picking one in the panel shows the verdict at once, from
        this measurement.

        Raises:
            TypeError / ValueError: ``answer`` not an option's index, ``measured`` not a string.
        """
        check_int("answer", answer, 0, len(self.options) - 1)
        check_type("measured", measured, str)
        self._measured = (int(answer), measured)
        if self.choice is None:
            self.verdict = None
            return tr("Measured. Pick your prediction in the panel above: its verdict appears there at once.")
        return self._judge(int(answer), measured)

    def _judge(self, answer: int, measured: str) -> str:
        right = self.options[answer]
        if self.choice == answer:
            self.verdict = f"{RIGHT} " + tr("Measured: {measured} → “{right}”, as you predicted.",
                                            measured=measured, right=right)
        else:
            self.verdict = f"{WRONG} " + tr("Measured: {measured} → “{right}”; you predicted “{choice}”.",
                                            measured=measured, right=right, choice=self.options[self.choice])
        for listener in self._listeners:
            with contextlib.suppress(Exception):      # a broken panel must not hide the measurement's verdict
                listener(self.choice == answer, self.verdict)
        return self.verdict


class Quiz:
    """An ordered list of questions with plain-call checking (``answer``) and a summary (``report``)."""

    def __init__(self, questions: Sequence[Question], title: str | None = None):
        if not questions:
            raise ValueError("a quiz needs at least one question, got none")
        for q in questions:
            check_type("question", q, (MultipleChoice, Numeric))
        self.questions = list(questions)
        self.title = tr("Quiz") if title is None else check_type("title", title, str)

    def __len__(self) -> int:
        return len(self.questions)

    def answer(self, index: int, value) -> tuple[bool, str]:
        """Check ``value`` against question ``index`` (0-based); returns ``(ok, explanation)``."""
        check_int("index", index, 0, len(self.questions) - 1)
        return self.questions[index].check(value)

    def report(self, answers: Sequence) -> str:
        """One line per question, ``✓``/``✗`` + explanation, then the score. ``None`` = not answered."""
        lines, score = [], 0
        for i, q in enumerate(self.questions):
            given = answers[i] if i < len(answers) else None
            if given is None:
                lines.append(tr("Q{i} – not answered", i=i + 1))
                continue
            ok, why = q.check(given)
            score += ok
            lines.append(f"Q{i + 1} {RIGHT if ok else WRONG} {why}")
        lines.append(tr("score: {score} / {total}", score=score, total=len(self.questions)))
        return "\n".join(lines)
