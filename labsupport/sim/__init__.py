"""Fast pure-Python simulators used where the real engine is too slow for a slider."""

from .._faces import lazy_face

_FACE = {                  # what the chapters use: imported on first use (labsupport._faces)
    "assign_slots": "timeline",
    "cached_block_ids": "timeline",
    "frame_from_snapshot": "timeline",
    "simulate_batching": "batching",
    "state_matrix": "timeline",
}
__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
