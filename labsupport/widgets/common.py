"""Helpers every panel shares: the red error line, the panel-range check of a starting value,
the guard that keeps an error inside a callback in the panel instead of the notebook, and the
panels' figure (:class:`FigureOutput`)."""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Callable

import ipywidgets as widgets
import plotly.graph_objects as go

from ..validation import check_int, check_real, is_int


def error_html(err: BaseException) -> str:
    """One red line saying what went wrong (HTML-escaped)."""
    return f"<span style='color:#b00020;font-size:16px'>⚠ {html.escape(str(err))}</span>"


def panel_int(name: str, value, low: int, high: int) -> int:
    """A starting value for an integer slider ``[low, high]``.

    Raises:
        TypeError: not an integer (numpy integers are accepted).
        ValueError: outside the panel's slider range (the message says that range).
    """
    return check_int(name, value, low, high, hint=" (the panel's slider range)")


def panel_real(name: str, value, low: float, high: float) -> float:
    """A starting value for a float slider ``[low, high]``.

    Raises:
        TypeError: not a number.
        ValueError: NaN, ±inf or outside the panel's slider range.
    """
    return check_real(name, value, low, high, hint=" (the panel's slider range)")


def panel_choice(name: str, value, choices) -> object:
    """A starting value that must be one of the panel's options.

    Raises:
        ValueError: not one of ``choices`` (the message lists them).
    """
    choices = list(choices)
    try:                                          # same type too: True is not the option 1
        ok = any(value == c and type(value) is type(c) or (is_int(value) and is_int(c) and value == c)
                 for c in choices)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of the panel's options {list(choices)}, got {value!r}")
    return value


def panel_text(name: str, value) -> str:
    """A starting text (a prompt box).

    Raises:
        TypeError: not a ``str``.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {value!r} ({type(value).__name__})")
    return value


def guarded(report: Callable[[str], None]) -> Callable[[Callable], Callable]:
    """Decorate a panel callback: any exception it raises is passed to ``report`` as a red
    line (:func:`error_html`) instead of reaching the notebook, and a run without error
    calls ``report("")`` to clear the line, so the panel keeps working after a bad value."""
    def wrap(callback: Callable) -> Callable:
        @functools.wraps(callback)
        def run(*args, **kwargs):
            try:
                result = callback(*args, **kwargs)
            except Exception as err:                  # noqa: BLE001 - a panel never throws into the notebook
                report(error_html(err))
                return None
            report("")
            return result
        return run
    return wrap


PLOTLY_MIME = "application/vnd.plotly.v1+json"


def show_figure(out: widgets.Output, figure: go.Figure) -> None:
    """Make ``out`` show ``figure`` (replacing what it showed), as a plain plotly output that
    JupyterLab's plotly renderer draws like any figure a cell displays (see :class:`FigureOutput`
    for why not a ``go.FigureWidget``)."""
    bundle = {PLOTLY_MIME: json.loads(figure.to_json()), "text/plain": f"<plotly figure: {figure.layout.title.text}>"}
    out.outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)


class FigureOutput(widgets.Output):
    """A panel's figure: an ``ipywidgets.Output`` showing one plotly figure, redrawn whole by :meth:`show`.

    Not a ``go.FigureWidget``: that one (plotly 7 on anywidget 0.11) is an ES module of 5 MB loaded
    per widget, and when loading it takes over 2 s (a busy browser), anywidget drops every later
    message to the widget, its first data and layout included: the figure stays empty axes, through
    every slider move. A plain plotly output is drawn by JupyterLab's plotly renderer instead.
    ``width`` (px, fixed; a figure's own width wins): an output drawn off screen (a slide not
    shown) cannot measure its container. ``data`` and ``layout`` are those of the figure shown last.
    """

    def __init__(self, figure: go.Figure | None = None, *, width: int | None = 950, **kwargs) -> None:
        super().__init__(**kwargs)
        self.width = width
        self.figure = go.Figure()
        if figure is not None:
            self.show(figure)

    def show(self, figure: go.Figure) -> None:
        """Show ``figure`` (at the fixed width) instead of the one shown before."""
        if self.width is not None and figure.layout.width is None:
            figure.update_layout(width=self.width, autosize=False)
        self.figure = figure
        show_figure(self, figure)

    @property
    def data(self):
        return self.figure.data

    @property
    def layout(self):
        return self.figure.layout
