"""ipywidgets panels that wire sliders to core functions and ``viz`` figures (no core logic here)."""

from .._faces import lazy_face

_FACE = {                  # what the chapters use: imported on first use (labsupport._faces)
    "batching_lab": "batching",
    "batch_lab": "reproducibility",
    "beam_explorer": "beam",
    "block_table_stepper": "paged",
    "cacheblend_lab": "serving",
    "cluster_panel": "parallel",
    "disaggregation_lab": "batching",
    "fragmentation_lab": "paged",
    "goodput_lab": "batching",
    "kv_cache_animation": "kv",
    "kv_memory_calculator": "kv",
    "pipeline_panel": "parallel",
    "predict_panel": "quiz",
    "quant_lab": "quant",
    "quiz_panel": "quiz",
    "round_panel": "speculative",
    "sampling_lab": "sampling",
    "step_time_lab": "batching",
    "structured_lab": "structured",
    "temperature_panel": "sampling",
    "theory_panel": "speculative",
    "tier_lab": "serving",
    "variants_panel": "speculative_variants",
}
__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
