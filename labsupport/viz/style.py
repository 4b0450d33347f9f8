"""The one figure style of the course: fonts a projector can show, the white template, a title.

Every figure builder in :mod:`labsupport.viz` ends with :func:`style` (or sets ``font=FONT`` and
``template=TEMPLATE`` when it lays the figure out itself), so all chapters look alike.
"""

from __future__ import annotations

import plotly.graph_objects as go

FONT_SIZE = 16                                 # ≥ 14 px everywhere: readable from the back of a room
FONT = {"size": FONT_SIZE}
TITLE_FONT = {"size": FONT_SIZE + 4}
TEMPLATE = "plotly_white"

LEGEND_TOP = {"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0}
# at the bottom of the figure: in a narrow notebook column a legend at the top wraps onto the title
LEGEND_BOTTOM = {"orientation": "h", "yref": "container", "yanchor": "bottom", "y": 0.0, "xanchor": "left", "x": 0.0}


def style(fig: go.Figure, title: str, height: int, *, left: int = 80, top: int = 80, bottom: int = 60,
          legend: dict | None = None, annotation_size: int | None = None) -> go.Figure:
    """Title, fonts, template, height and margins of a figure (in place; returns it).

    Args:
        title: the figure's title. height: pixels. left / top / bottom: margins in pixels.
        legend: a legend placement (:data:`LEGEND_TOP`, :data:`LEGEND_BOTTOM`) or None (plotly's).
        annotation_size: font size of the annotations, when the figure has any.
    """
    fig.update_layout(title={"text": title, "font": TITLE_FONT}, font=FONT, template=TEMPLATE, height=height,
                      margin={"l": left, "r": 30, "t": top, "b": bottom})
    if legend is not None:
        fig.update_layout(legend=legend)
    if annotation_size is not None:
        fig.update_annotations(font={"size": annotation_size})
    return fig
