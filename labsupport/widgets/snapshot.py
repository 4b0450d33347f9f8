"""Static snapshots of live panels, for exports that have no kernel (offline reveal.js slides).

A panel is an ``ipywidgets`` box; in JupyterLab it is live. An exported HTML file (``make
slides``) has no kernel, so a widget view there would be an empty box. :class:`Panel` is an
``ipywidgets.VBox`` whose display bundle carries, next to the widget view, a ``text/html``
snapshot of what the panel shows at that moment: every figure as a static plotly chart, every
readout and HTML text, and each control's value (``temperature T = 1.00``). JupyterLab renders
the live widget (it ranks the widget view first); nbconvert's slide export keeps the snapshot.

The snapshot's plotly charts call the global ``Plotly`` (``include_plotlyjs=False``): the page
must load plotly.js once, as the offline slide template of ``labsupport.slides`` does.

Nothing here throws into the notebook: a part that cannot be rendered becomes a short note.
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

from ..i18n import tr

_PLOTLY_MIME = "application/vnd.plotly.v1+json"


def figure_html(figure: go.Figure | dict) -> str:
    """A static plotly chart (``<div>`` + ``<script>``) of ``figure``; needs plotly.js on the page."""
    fig = go.Figure(figure.to_dict() if hasattr(figure, "to_dict") else figure)
    return pio.to_html(fig, include_plotlyjs=False, full_html=False, config={"displayModeBar": False})


def _choices_html(w: widgets.Widget) -> str:
    """Every option of a choice widget, the chosen one marked: ``○ a  ● b  ○ c`` (a quiz's options
    are the question, so they are shown even when nothing is chosen yet)."""
    items = "".join(f"<span style='display:inline-block;margin:2px 14px 2px 0'>{'●' if lab == w.label else '○'} "
                    f"{html.escape(str(lab))}</span>" for lab in w._options_labels)
    label = getattr(w, "description", "") or ""
    return (f"<div style='font-size:15px'>{html.escape(label) + ': ' if label else ''}{items}</div>")


def _control_html(w: widgets.Widget) -> str:
    label = getattr(w, "description", "") or ""
    if isinstance(w, widgets.Button):
        return ""
    if isinstance(w, (widgets.RadioButtons, widgets.ToggleButtons)) or (
            isinstance(w, (widgets.Dropdown, widgets.Select)) and w.label is None):
        return _choices_html(w)
    if isinstance(w, (widgets.Dropdown, widgets.Select)):
        value = w.label
    elif isinstance(w, widgets.Text) and not w.value:                 # an empty answer box: draw the box
        return (f"<span style='display:inline-block;margin:2px 18px 2px 0;font-size:15px'>{html.escape(label)} "
                f"<span style='display:inline-block;min-width:200px;border:1px solid #999;border-radius:3px;"
                f"padding:2px 6px;color:#888'>{html.escape(w.placeholder or '')}</span></span>")
    elif hasattr(w, "value"):
        value = w.value
        if isinstance(value, float):
            fmt = getattr(w, "readout_format", ".2f") or ".2f"
            try:
                value = format(value, fmt)
            except ValueError:
                value = f"{value:g}"
    else:
        return ""
    return (f"<span style='display:inline-block;margin:2px 18px 2px 0;font-size:15px'>{html.escape(label)}"
            f"{' = ' if label else ''}<b>{html.escape(str(value))}</b></span>")


def _output_html(out: dict) -> str:
    kind = out.get("output_type")
    if kind == "stream":
        return f"<pre>{html.escape(out.get('text', ''))}</pre>"
    data = out.get("data", {})
    if _PLOTLY_MIME in data:
        return figure_html(data[_PLOTLY_MIME])
    if "text/html" in data:
        return data["text/html"]
    if "image/png" in data:
        return f"<img src='data:image/png;base64,{data['image/png']}'/>"
    if "text/plain" in data:
        return f"<pre>{html.escape(data['text/plain'])}</pre>"
    return ""


def snapshot_html(w: widgets.Widget) -> str:
    """Static HTML of a widget tree as it looks now (figures, readouts, control values).

    Never raises: a part that fails to render becomes a short grey note.
    """
    try:
        layout = getattr(w, "layout", None)
        if layout is not None and (getattr(layout, "display", None) == "none"
                                   or getattr(layout, "visibility", None) == "hidden"):
            return ""                                    # hidden in the live panel: hidden here too
        if isinstance(w, go.FigureWidget):
            return figure_html(w)
        if isinstance(w, widgets.Box):
            direction = "row" if isinstance(w, widgets.HBox) else "column"
            wrap = "flex-wrap:wrap;align-items:center;" if direction == "row" else ""
            inner = "".join(snapshot_html(c) for c in w.children)
            return f"<div style='display:flex;flex-direction:{direction};{wrap}gap:4px'>{inner}</div>"
        if isinstance(w, widgets.Output):
            return "".join(_output_html(o) for o in w.outputs)
        if isinstance(w, (widgets.HTML, widgets.HTMLMath)):
            return f"<div>{w.value}</div>"
        if isinstance(w, widgets.Label):
            return f"<span>{html.escape(w.value)}</span>"
        if isinstance(w, widgets.Play):
            return ""
        return _control_html(w)
    except Exception as err:  # noqa: BLE001 - a snapshot must never break the display of the live panel
        note = tr("[{kind}: no snapshot ({error})]", kind=type(w).__name__, error=html.escape(str(err)))
        return f"<span style='color:#777'>{note}</span>"


class Panel(widgets.VBox):
    """An ``ipywidgets.VBox`` that also offers a static ``text/html`` snapshot when displayed."""

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, tuple):            # (data, metadata) form
            data, meta = bundle
        else:
            data, meta = bundle, None
        data = dict(data)
        data["text/html"] = ("<div class='labsupport-panel-snapshot' style='border-left:4px solid #1f77b4;"
                             f"padding-left:8px'>{snapshot_html(self)}</div>")
        return (data, meta) if meta is not None else data


def panel(children, **kwargs) -> Panel:
    """``Panel(children)``: a drop-in for ``widgets.VBox(children)`` in panel constructors."""
    return Panel(children, **kwargs)


__all__ = ["Panel", "figure_html", "panel", "snapshot_html"]
