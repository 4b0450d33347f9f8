"""Benchmarks of the course (``python -m labsupport.bench NAME``): ``engine``, ``speculative``,
``speculative-variants``, ``kv-cache``, ``structured``, ``vllm`` (needs ``make vllm``) or ``all``.
They print tables of measured times and ratios; they are not tests (no wall-clock time is ever
asserted) and they fix the torch thread count explicitly."""

BENCHMARKS = {"engine": "engine", "speculative": "speculative", "kv-cache": "kv_cache", "structured": "structured",
              "speculative-variants": "speculative_variants", "vllm": "vs_vllm"}
