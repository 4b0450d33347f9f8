"""``python -m labsupport.bench NAME [args]``: run one benchmark (or ``all``).

Each NAME maps to a module ``labsupport.bench.<module>`` with ``main(argv) -> int``:
``engine`` → ``engine``, ``speculative`` → ``speculative``, ``kv-cache`` → ``kv_cache``,
``structured`` → ``structured``, ``speculative-variants`` → ``speculative_variants``,
``vllm`` → ``vs_vllm``. ``all`` runs every one that exists, with default arguments (one whose
``unavailable()`` gives a reason, such as ``vllm`` without ``.venv-vllm``, is skipped with that
reason). Each runs once: ``speculative`` ends with the variants' table when run alone, so
``all`` runs it with ``--no-variants`` (``ALL_ARGS``) and the variants come from their own entry.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import BENCHMARKS

#: Arguments ``all`` passes to a benchmark (default: none): no benchmark runs another one's part.
ALL_ARGS = {"speculative": ["--no-variants"]}


def _load(name: str):
    module = f"{__package__}.{BENCHMARKS[name]}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labsupport.bench",
                                     description="Run a benchmark of the course and print its table.")
    parser.add_argument("name", choices=[*BENCHMARKS, "all"], help="which benchmark")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="arguments for that benchmark (see NAME --help); 'all' uses each one's defaults")
    ns = parser.parse_args(argv)
    if ns.name != "all":
        module = _load(ns.name)
        if module is None:
            print(f"benchmark {ns.name!r} is not available: module labsupport.bench.{BENCHMARKS[ns.name]} "
                  "does not exist in this checkout", file=sys.stderr)
            return 2
        return int(module.main(ns.args) or 0)
    status = 0
    for name in BENCHMARKS:
        module = _load(name)
        if module is None:
            print(f"== {name}: skipped (labsupport.bench.{BENCHMARKS[name]} does not exist)\n")
            continue
        reason = getattr(module, "unavailable", lambda: None)()
        if reason:
            print(f"== {name}: skipped ({reason})\n")
            continue
        print(f"== {name}")
        status = max(status, int(module.main(list(ALL_ARGS.get(name, []))) or 0))
        print()
    return status


if __name__ == "__main__":
    sys.exit(main())
