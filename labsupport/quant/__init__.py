"""Quantisation: fewer bytes per weight and per cached token (chapter 11).

``formats`` (number formats, :func:`quantize` per tensor / channel / group, errors) ·
``weights`` (weight-only RTN and AWQ on the real GPT-2, perplexity and agreement) ·
``int8`` (an int8 matmul that runs on this CPU; the engine's ``quantization="int8"``) ·
``kv`` (8-bit KV blocks; the engine's ``kv_cache_dtype``) · ``scale`` (weights and KV of
large models per format, and the roofline's step time).
"""

from .formats import FORMATS, GRANULARITIES, NumberFormat, QuantizedTensor, fake_quantize, format_table, number_format, quantize, relative_error
from .kv import KV_CACHE_DTYPES, dequantize_kv, quantize_kv
from .weights import TARGETS, QuantizedModel, Score, greedy_agreement, quantize_model, score, top1_agreement

__all__ = [
    "FORMATS", "GRANULARITIES", "KV_CACHE_DTYPES", "TARGETS", "NumberFormat", "QuantizedModel", "QuantizedTensor",
    "Score", "dequantize_kv", "fake_quantize", "format_table", "greedy_agreement", "number_format", "quantize",
    "quantize_kv", "quantize_model", "relative_error", "score", "top1_agreement",
]

from .._faces import lazy_face

_FACE = {                  # what the chapters use: imported on first use (labsupport._faces)
    "at_scale": "scale",
    "awq_scale": "weights",
    "layer_inputs": "weights",
    "linear_layers": "weights",
    "out_in": "weights",
    "outlier_errors": "outliers",
    "plant_outlier": "outliers",
}
__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
