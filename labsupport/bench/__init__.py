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
