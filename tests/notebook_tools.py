"""Maintainer tool for chapters: execute a notebook, then keep only the outputs nbval compares.

    python tests/notebook_tools.py chapters/01_sampling.ipynb [more.ipynb ...] [--no-execute]
    python tests/notebook_tools.py --test-copy build/nbval chapters/*.ipynb

Default mode: every cell is executed in the current environment (kernel ``python3``).
Afterwards the notebook is written exactly as the git filter ``nbstripout`` would commit it
(``make setup`` installs that filter): all outputs and execution counts are removed except in
cells whose first line is ``# NBVAL_CHECK_OUTPUT``; those get ``"keep_output": true`` cell
metadata (nbstripout's own marker) and keep their plain-text output. The kernelspec is set to
plain ``python3`` and the slide types follow ``labsupport.slides.deck_slide_types`` ("continue
the slide" is ``""``, which the live deck shows; the set-up cell is on the title slide). Prints
each chapter's run time. Re-apply the slide rule alone, without executing:
``python tests/notebook_tools.py --no-execute chapters/*.ipynb``.

``--test-copy DIR``: write a clean copy of each notebook under ``DIR`` (same relative path) for
nbval: the cells' code comes from the working file, the reference outputs of the marked cells
from the last commit (``git show HEAD:path``, matched by cell source; the working file's own
output when the cell is new or not in git). Outputs a student saved while working therefore
never fail ``make test``. Kept cells get an execution count (nbval skips a reference cell
without one and fails one that has outputs but no count).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbstripout import strip_output

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:                     # run as a script from a checkout
    sys.path.insert(0, str(ROOT))
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
    # nbstripout's defaults (also drops metadata.widgets: saved widget state, stale on the next run)
    return strip_output(nb, keep_output=None, keep_count=False, keep_id=False,
                        extra_keys=["metadata.signature", "metadata.widgets", "cell.metadata.collapsed",
                                    "cell.metadata.ExecuteTime", "cell.metadata.execution",
                                    "cell.metadata.heading_collapsed", "cell.metadata.hidden",
                                    "cell.metadata.scrolled"])


def committed_version(path: Path) -> nbformat.NotebookNode | None:
    """The notebook as of the last commit, or None outside git / for a file never committed."""
    try:
        rel = path.resolve().relative_to(ROOT)
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{rel.as_posix()}"], check=True,
                              capture_output=True, text=True).stdout
    except (ValueError, OSError, subprocess.CalledProcessError):
        return None
    return nbformat.reads(text, as_version=4)


def test_copy(path: Path, dest_root: Path) -> Path:
    """Write the clean nbval copy of ``path`` under ``dest_root``; returns the copy's path."""
    nb = nbformat.read(path, as_version=4)
    ref = committed_version(path)
    reference = {c.source: c.outputs for c in (ref.cells if ref else []) if is_marked(c) and c.outputs}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs = _plain_outputs(reference.get(cell.source, cell.outputs)) if is_marked(cell) else []
        cell.execution_count = 1 if cell.outputs else None
    nb.metadata.pop("widgets", None)
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        rel = Path(path.name)
    out = dest_root / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--no-execute", action="store_true")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--test-copy", type=Path, metavar="DIR", help="write clean nbval copies under DIR")
    args = parser.parse_args(argv)
    for path in args.notebooks:
        if args.test_copy:
            test_copy(path, args.test_copy)
            continue
        nb = nbformat.read(path, as_version=4)
        if not args.no_execute:
            start = time.perf_counter()
            NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
            print(f"{path}: executed in {time.perf_counter() - start:.1f} s")
        nbformat.write(normalise(nb), path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
