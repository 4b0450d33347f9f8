"""The chapters' git clean filter: nbstripout, with the compared cells' execution counts kept.

``make setup`` installs nbstripout as the git filter of ``*.ipynb`` and points its *clean* step
at ``python -m labsupport.nbfilter``: a notebook is committed without outputs, execution counts
or saved widget state — except the cells whose first line is ``# NBVAL_CHECK_OUTPUT`` (they carry
nbstripout's ``keep_output`` marker). Those keep their text *and* an execution count (1, 2, …
in order): nbval compares a cell's output only when the reference cell has a count, and fails
one with outputs but none ("Unrun reference cell has outputs"). With the counts in the committed
file, plain ``pytest --nbval-lax chapters/`` works on a fresh clone, as nbval's users write it.

Stripping itself is nbstripout's (:func:`nbstripout.strip_output`); this module only numbers
the kept cells afterwards, so a saved notebook still filters to exactly the committed file.
"""

from __future__ import annotations

import sys

import nbformat
from nbstripout import strip_output

EXTRA_KEYS = ["metadata.signature", "metadata.widgets", "cell.metadata.collapsed", "cell.metadata.ExecuteTime",
              "cell.metadata.execution", "cell.metadata.heading_collapsed", "cell.metadata.hidden",
              "cell.metadata.scrolled"]
"""Metadata the filter drops besides outputs and counts (nbstripout's defaults)."""


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` as it is committed (changed in place, returned): nbstripout's strip, then every
    ``keep_output`` cell with outputs numbered 1, 2, … (its execute results too)."""
    strip_output(nb, keep_output=None, keep_count=False, keep_id=False, extra_keys=EXTRA_KEYS)
    count = 0
    for cell in nb.cells:
        if cell.get("cell_type") == "code" and cell.get("metadata", {}).get("keep_output") and cell.get("outputs"):
            count += 1
            cell["execution_count"] = count
            for out in cell["outputs"]:
                if "execution_count" in out:
                    out["execution_count"] = count
    return nb


def main() -> int:
    """Filter a notebook from stdin to stdout (git's clean filter protocol). Not a notebook: a one-line
    message on stderr and exit status 1 (git then refuses the file, as with nbstripout itself)."""
    try:
        nb = nbformat.reads(sys.stdin.buffer.read().decode("utf-8-sig"), as_version=nbformat.NO_CONVERT)
        text = nbformat.writes(clean(nb))
    except Exception as err:  # noqa: BLE001 - any unreadable input gets the same short message
        print(f"labsupport.nbfilter: no valid notebook on stdin ({type(err).__name__}: {str(err)[:120]})",
              file=sys.stderr)
        return 1
    sys.stdout.buffer.write((text if text.endswith("\n") else text + "\n").encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
