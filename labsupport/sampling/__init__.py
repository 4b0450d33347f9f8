"""Turning logits into a next token: the logits processors, ``SamplingParams`` and ``sample``.

``processors`` (penalties, temperature, top-k, top-p, min-p — each ``(batch, vocab)`` logits in,
logits with removed candidates at ``-inf`` out) · ``params`` (``SamplingParams``) ·
``pipeline`` (their order, ``process_logits``, ``sample``, ``trace_filters``) · ``measures``
(entropy, perplexity). The pipeline order is Hugging Face's and vLLM's::

    penalties → min_tokens mask → temperature → top-k → top-p → min-p → renormalise → sample

Ties in top-k and top-p: among equal logits the lower token id comes first (a stable sort).
"""

from .measures import candidates_for_mass, entropy_bits, perplexity, probability_ratio, sequence_perplexity
from .params import GREEDY, SamplingParams
from .pipeline import (
    FilterTrace,
    greedy_ids,
    penalise,
    probs_from_logits,
    process_logits,
    sample,
    sample_from,
    trace_filters,
)
from .processors import (
    NEG_INF,
    TOP_P_TOLERANCE,
    apply_frequency_presence_penalty,
    apply_repetition_penalty,
    apply_temperature,
    mask_end_ids,
    min_p_filter,
    top_k_filter,
    top_p_filter,
)

__all__ = [
    "GREEDY",
    "NEG_INF",
    "TOP_P_TOLERANCE",
    "FilterTrace",
    "SamplingParams",
    "apply_frequency_presence_penalty",
    "apply_repetition_penalty",
    "apply_temperature",
    "candidates_for_mass",
    "entropy_bits",
    "greedy_ids",
    "mask_end_ids",
    "min_p_filter",
    "penalise",
    "perplexity",
    "probability_ratio",
    "probs_from_logits",
    "process_logits",
    "sample",
    "sample_from",
    "sequence_perplexity",
    "top_k_filter",
    "top_p_filter",
    "trace_filters",
]
