"""Exercise checks that always report ✓/✗ with a concrete message and never stop "Run All".

Two helpers, used by every chapter's exercises:

* :func:`check_function` runs a student's function on cases and compares with a reference
  (usually the ``labsupport`` function the chapter teaches). A stub that still raises
  ``NotImplementedError`` reports "not done yet"; any other exception or a wrong result reports
  the first failing case with the arguments, what came back and what was expected.
* :func:`check_answer` checks a value the student typed (``None`` = not answered yet) with a
  predicate or a tolerance, and on a wrong try says what is wrong *without* giving the answer.

Both print one line and return an :class:`ExerciseResult` (truthy when right). Neither raises
for anything the student's code does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from labsupport.i18n import tr
from labsupport.quiz import RIGHT, WRONG


@dataclass(frozen=True)
class ExerciseResult:
    """``ok``: passed; ``done``: attempted (not a stub / not ``None``); ``message``: the line printed."""

    ok: bool
    done: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def _ipython_display_(self) -> None:
        """Show nothing as a cell's last value: the check has already printed its line (a repr under it
        would only repeat it as ``ExerciseResult(ok=False, ...)``)."""


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _report(ok: bool, done: bool, message: str, quiet: bool) -> ExerciseResult:
    line = f"{RIGHT if ok else ('…' if not done else WRONG)} {message}"
    if not quiet:
        print(line)
    return ExerciseResult(ok, done, line)


def _equal(got: Any, want: Any, tol: float) -> bool:
    try:
        import torch

        if isinstance(got, torch.Tensor) or isinstance(want, torch.Tensor):
            g, w = torch.as_tensor(got), torch.as_tensor(want)
            return g.shape == w.shape and bool(torch.allclose(g.double(), w.double(), atol=tol, rtol=tol,
                                                                equal_nan=True))
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    if isinstance(got, float) or isinstance(want, float):
        try:
            return math.isclose(float(got), float(want), rel_tol=tol, abs_tol=tol)
        except (TypeError, ValueError):
            return False
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_equal(g, w, tol) for g, w in zip(got, want))
    try:
        return bool(got == want)
    except Exception:  # noqa: BLE001 - an exotic type that cannot be compared is a mismatch
        return False


def check_function(fn: Callable, cases: Iterable[Sequence | dict], reference: Callable, *,
                   name: str | None = None, tol: float = 1e-6,
                   compare: Callable[[Any, Any], bool] | None = None, quiet: bool = False) -> ExerciseResult:
    """Compare ``fn(*case)`` with ``reference(*case)`` on every case (a tuple of args or a dict of kwargs).

    Args:
        fn: the student's function.
        cases: argument tuples (or keyword dicts) to call both functions with.
        reference: the function giving the right result.
        name: shown in messages (default ``fn.__name__``).
        tol: relative/absolute tolerance for floats and tensors.
        compare: ``compare(got, want) -> bool`` replacing the default equality.
        quiet: do not print (the message is in the result).
    """
    label = name or (fn.__name__ if hasattr(fn, "__name__") else tr("your function"))
    count = 0
    for case in cases:
        args, kwargs = ((), dict(case)) if isinstance(case, dict) else (tuple(case), {})
        shown = ", ".join([_short(a, 40) for a in args] + [f"{k}={_short(v, 40)}" for k, v in kwargs.items()])
        want = reference(*args, **kwargs)
        try:
            got = fn(*args, **kwargs)
        except NotImplementedError:
            return _report(False, False, tr("{label} is not implemented yet — fill in the stub and run the check again",
                                            label=label), quiet)
        except Exception as err:  # noqa: BLE001 - the student's code may raise anything; report it
            return _report(False, True, tr("{label}({args}) raised {error}: {message}", label=label, args=shown,
                                           error=type(err).__name__, message=err), quiet)
        same = compare(got, want) if compare else _equal(got, want, tol)
        if not same:
            return _report(False, True, tr("{label}({args}) returned {got}, expected {want}", label=label, args=shown,
                                           got=_short(got), want=_short(want)), quiet)
        count += 1
    return _report(True, True, tr("{label} agrees with the reference on all {count} cases", label=label, count=count),
                   quiet)


def check_answer(value: Any, *, name: str, expected: float | None = None, rel_tol: float = 0.0,
                 abs_tol: float = 0.0, accept: Callable[[Any], bool] | None = None,
                 explain: Callable[[Any], str] | None = None, right: str | None = None,
                 quiet: bool = False) -> ExerciseResult:
    """Check a typed answer: ``accept(value)`` if given, else ``|value − expected|`` within the tolerance.

    ``None`` means not answered yet. On a wrong try the message is ``explain(value)`` (what the
    value implies, e.g. "at α = 0.84 A still wins: −1.91 vs −1.92"), never the expected value;
    on a right one it is ``right`` (default "right").
    """
    if value is None:
        return _report(False, False, tr("set {name} to your answer and run this cell again", name=name), quiet)
    try:
        if accept is not None:
            ok = bool(accept(value))
        else:
            ok = math.isclose(float(value), float(expected), rel_tol=rel_tol, abs_tol=abs_tol)
    except Exception as err:  # noqa: BLE001 - a value of the wrong kind is a wrong answer
        return _report(False, True, tr("{name} = {value} cannot be checked: {error}: {message}", name=name,
                                       value=_short(value), error=type(err).__name__, message=err), quiet)
    if ok:
        return _report(True, True, f"{name} = {_short(value)}: {tr('right') if right is None else right}", quiet)
    try:
        why = explain(value) if explain else tr("not quite — check your working")
    except Exception as err:  # noqa: BLE001
        why = tr("not quite ({error}: {message})", error=type(err).__name__, message=err)
    return _report(False, True, f"{name} = {_short(value)}: {why}", quiet)


def run_check(check: Callable[[Callable], int], fn: Callable, *, name: str | None = None,
              against: str | None = None, quiet: bool = False) -> ExerciseResult:
    """Run a chapter's ``check(fn) -> number of cases`` (which asserts) and report instead of raising.

    ``NotImplementedError`` from the stub → "not implemented yet"; an ``AssertionError`` → ✗ with its
    message (the check's concrete case: arguments, what came back, what was expected); any other
    exception → ✗ naming it; otherwise ✓ with the number of cases. ``against`` names what the
    function is compared with (default "the reference").
    """
    label = name or (fn.__name__ if hasattr(fn, "__name__") else tr("your function"))
    against = tr("the reference") if against is None else against
    try:
        cases = check(fn)
    except NotImplementedError:
        return _report(False, False, tr("{label} is not implemented yet — write it where it says YOUR CODE HERE, "
                                        "then run the cells from there to this one again", label=label), quiet)
    except AssertionError as err:
        detail = str(err) or tr("a case failed (the check gave no detail)")
        return _report(False, True, tr("{label} disagrees with {against}: {detail}", label=label, against=against,
                                       detail=detail), quiet)
    except Exception as err:  # noqa: BLE001 - the student's code may raise anything; report it
        return _report(False, True, tr("{label} raised {error}: {message}", label=label, error=type(err).__name__,
                                       message=err), quiet)
    return _report(True, True, tr("{label} agrees with {against} on {cases} cases", label=label, against=against,
                                  cases=cases), quiet)
