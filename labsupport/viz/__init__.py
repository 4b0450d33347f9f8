"""Plotly figure builders: pure functions ``data → go.Figure``, no widgets inside."""

from .._faces import lazy_face

_FACE = {                  # what the chapters use: imported on first use (labsupport._faces)
    "beam_tree_figure": "beam",
    "chosen_prob_figure": "sampling",
    "display_text": "beam",
    "entropy_curve_figure": "sampling",
    "length_penalty_figure": "beam",
    "request_timeline_figure": "kv",
    "step_time_figure": "kv",
    "timing_figure": "kv",
}
__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
