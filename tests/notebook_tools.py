"""Maintainer tool for chapters: execute a notebook, then keep only the outputs nbval compares.

    python tests/notebook_tools.py chapters/01_sampling.ipynb [more.ipynb ...] [--no-execute]

Default mode: every cell is executed in the current environment (kernel ``python3``).
Afterwards the notebook is written exactly as the git filter commits it (``make setup``
installs nbstripout with :mod:`labsupport.nbfilter` as its clean step): all outputs and
execution counts are removed except in cells whose first line is ``# NBVAL_CHECK_OUTPUT``;
those get ``"keep_output": true`` cell metadata (nbstripout's own marker), keep their
plain-text output and an execution count, so plain ``pytest --nbval-lax chapters/`` compares
them. The kernelspec is set to plain ``python3`` and the slide types follow
``labsupport.slides.deck_slide_types`` ("continue the slide" is ``""``, which the live deck
shows; the set-up cell is on the title slide). Prints each chapter's run time. Re-apply the
committed form alone, without executing: ``python tests/notebook_tools.py --no-execute chapters/*.ipynb``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:                     # run as a script from a checkout
    sys.path.insert(0, str(ROOT))
from labsupport.nbfilter import clean
from labsupport.slides import deck_slide_types

MARK = "NBVAL_CHECK_OUTPUT"


def is_marked(cell: nbformat.NotebookNode) -> bool:
    """True for a code cell whose outputs nbval compares (first line ``# NBVAL_CHECK_OUTPUT``)."""
    return cell.cell_type == "code" and cell.source.lstrip().startswith(f"# {MARK}")


def _plain_outputs(outputs: list) -> list:
    """Keep stdout and the ``text/plain`` of results: the deterministic text nbval compares."""
    kept = []
    for o in outputs:
        if o.get("output_type") == "stream" and o.get("name") == "stdout":
            kept.append(o)
        elif o.get("output_type") == "execute_result":
            o["execution_count"] = None
            o["data"] = {k: v for k, v in o["data"].items() if k == "text/plain"}
            o["metadata"] = {}
            kept.append(o)
    return kept


def normalise(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The committed form of a chapter: a fixed point of nbstripout's git filter."""
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata.setdefault("language_info", {"name": "python"})
    if (nb.nbformat, nb.nbformat_minor) >= (4, 5):
        for i, cell in enumerate(nb.cells):       # every cell an id (nbstripout numbers them the same way)
            cell["id"] = str(i)
    deck_slide_types(nb)                          # slide types the live deck shows (labsupport.slides)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if is_marked(cell):
            cell.metadata["keep_output"] = True
            cell.outputs = _plain_outputs(cell.outputs)
        else:
            cell.metadata.pop("keep_output", None)
            cell.outputs = []
    # the git filter's own strip: nbstripout, then the kept cells numbered (labsupport.nbfilter)
    return clean(nb)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--no-execute", action="store_true")
    parser.add_argument("--timeout", type=int, default=600)
    args = parser.parse_args(argv)
    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        if not args.no_execute:
            start = time.perf_counter()
            km = None
            if os.name != "nt":                  # a local socket: no "kernel over TCP without encryption" warning
                from jupyter_client import KernelManager
                sockets = Path(tempfile.mkdtemp(prefix="labsupport-kernel-")) / "kernel"   # absolute: the kernel
                km = KernelManager(kernel_name="python3", transport="ipc", ip=str(sockets))   # runs elsewhere
            NotebookClient(nb, km=km, timeout=args.timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
            print(f"{path}: executed in {time.perf_counter() - start:.1f} s")
        nbformat.write(normalise(nb), path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
