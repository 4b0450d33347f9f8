"""Benchmarks of the course (``python -m labsupport.bench NAME``): ``engine``, ``speculative``,
``kv-cache``, ``structured`` or ``all``. They print tables of measured times and ratios; they are not tests
(no wall-clock time is ever asserted) and they fix the torch thread count explicitly."""

BENCHMARKS = {"engine": "engine", "speculative": "speculative", "kv-cache": "kv_cache", "structured": "structured"}
