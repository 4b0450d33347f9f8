"""Benchmarks of the course (``python -m labsupport.bench NAME``): ``engine``, ``speculative``,
``speculative-variants``, ``kv-cache``, ``structured``, ``quant``, ``vllm`` (needs ``make vllm``) or ``all``.
They print tables of measured times and ratios; they are not tests (no wall-clock time is ever
asserted) and they fix the torch thread count explicitly.

Every wall-clock measurement of the package lives here, on :mod:`labsupport.timing`: the
chapters import the same functions the command line runs (``bench.speculative.measure_costs``,
``bench.kv_cache.time_cached_vs_uncached``, ``bench.speculative_variants.measure_methods`` …),
so a timing printed in a chapter and one printed by ``python -m labsupport.bench`` are one code
path. (The core packages stamp times only for their own metrics: arrival, first token, TPOT.)"""

BENCHMARKS = {"engine": "engine", "speculative": "speculative", "kv-cache": "kv_cache", "structured": "structured",
              "speculative-variants": "speculative_variants", "vllm": "vs_vllm", "quant": "quant"}

from .._faces import lazy_face

_FACE = {                  # what the chapters use: imported on first use (labsupport._faces)
    "budget_run": "quant",
    "batch_sweep_runs": "speculative_variants",
    "compare_with_engine": "speculative",
    "default_methods": "speculative_variants",
    "forward_costs": "speculative_variants",
    "measure_costs": "spec_costs",
    "measure_methods": "speculative_variants",
    "prompt_of_length": "kv_cache",
    "request_token_times": "kv_cache",
    "speedup_sweep": "speculative",
    "step_times": "quant",
    "time_cached_vs_uncached": "kv_cache",
    "time_prefill_decode": "kv_cache",
    "weight_pass_seconds": "engine",
}
__getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
