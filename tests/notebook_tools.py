"""Maintainer tool for chapters: execute a notebook, then keep only the outputs nbval compares.

    python tests/notebook_tools.py chapters/01_sampling.ipynb [more.ipynb ...] [--no-execute]

Every cell is executed in the current environment (kernel ``python3``). Afterwards all
outputs and execution counts are removed except in cells containing ``# NBVAL_CHECK_OUTPUT``
(whose deterministic text nbval compares under ``--nbval-lax``). The kernelspec is set to
plain ``python3`` and cells without slide metadata get ``slide_type: "-"``. Prints each
chapter's run time.
"""

from __future__ import annotations

import argparse
import sys
import time

import nbformat
from nbclient import NotebookClient

MARK = "NBVAL_CHECK_OUTPUT"


def normalise(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata.setdefault("language_info", {"name": "python"})
    nb.metadata.pop("widgets", None)   # saved widget state: megabytes, and stale on the next run
    for cell in nb.cells:
        cell.metadata.setdefault("slideshow", {"slide_type": "-"})
        if cell.cell_type != "code":
            continue
        if MARK in cell.source:
            cell.outputs = [o for o in cell.outputs if o.get("output_type") in ("stream", "execute_result")
                            and not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
            for o in cell.outputs:
                if o.get("output_type") == "execute_result":
                    o["execution_count"] = None
                    o["data"] = {k: v for k, v in o["data"].items() if k == "text/plain"}
        else:
            cell.outputs = []
        # nbval skips (and, with outputs, fails) a cell whose execution_count is None: give kept outputs a count
        cell.execution_count = 1 if cell.outputs else None
        cell.metadata.pop("execution", None)
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--no-execute", action="store_true")
    parser.add_argument("--timeout", type=int, default=600)
    args = parser.parse_args(argv)
    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        if not args.no_execute:
            start = time.perf_counter()
            NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                           resources={"metadata": {"path": "chapters"}}).execute()
            print(f"{path}: executed in {time.perf_counter() - start:.1f} s")
        nbformat.write(normalise(nb), path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
