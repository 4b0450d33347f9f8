"""Offline reveal.js slide decks of the chapters: ``python -m labsupport.slides`` (``make slides``).

    python -m labsupport.slides chapters/*.ipynb --out build/slides [--no-execute]

Each chapter is executed (kernel ``python3``) and exported with nbconvert's reveal.js exporter
through the template ``labsupport/slides_template/offline``. Everything the deck loads is a
local file copied next to it, under ``<out>/vendor/``, from installed Python packages:

* reveal.js — from ``sphinx-revealjs`` (``_static/revealjs``),
* MathJax 2 — from ``jupyter-server-mathjax`` (``static``),
* plotly.js — from ``plotly`` (``package_data/plotly.min.js``).

So the decks open from disk with no network (a CDN is never contacted at view time). Figures
become static plotly charts; each live panel (:class:`labsupport.widgets.snapshot.Panel`) is
shown by its static snapshot (figures, readouts, control values at the moment it was built).
Live sliders need a kernel: present from JupyterLab (``jupyterlab-slideshow``) for those.

Slides are 1280 x 800 (reveal.js scales them to the window: 1280x720, 1920x1080 projectors).
A slide whose content is taller is shrunk to fit when that takes at most 20 %; a taller one
keeps its text size and scrolls: the keys that advance (→ ↓ Space PageDown, a clicker) first
page down through it, a "▼ more below" badge says there is more, and the keys that go back
page up first. MathJax's hidden MathML copy (for screen readers) is given local fonts, so no
TeX web font that jupyter-server-mathjax does not ship is ever requested.

``--keep-executed DIR`` also saves the executed notebooks: after a change of the template,
``--no-execute DIR/*.ipynb`` re-exports every deck in seconds.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .i18n import LANGUAGES, language, tr

MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: shown instead of a widget that has no static snapshot (its text/plain would be "VBox(children=...)")
NO_SNAPSHOT_HTML = ("<div class='labsupport-no-snapshot' style='color:#555;border-left:4px solid #bbb;"
                    "padding-left:8px'>{text}</div>")
"""Where a live panel left no snapshot; ``{text}`` is :func:`no_snapshot_text` in the deck's language."""


def no_snapshot_text() -> str:
    """The line a deck shows in place of a live panel that left no snapshot (in the current language)."""
    return tr("(a live panel: run this chapter in JupyterLab to use it)")
TEMPLATES = Path(__file__).resolve().parent / "slides_template"
# output priority in the deck: the snapshot's HTML before a widget view (which needs a kernel)
DISPLAY_PRIORITY = ["text/html", "application/pdf", "text/latex", "image/svg+xml", "image/png", "image/jpeg",
                    "text/markdown", "text/plain"]


# "Continue the current slide". JupyterLab 4's slide-type menu writes "-" as the empty string, and
# jupyterlab-slideshow (the live deck) only knows the empty string or no value: a cell marked with
# classic Notebook's "-" is a slide type it does not know, so it is never shown on any slide (a
# panel's code cell with its live output vanishes from the deck). nbconvert's reveal.js export reads
# "", "-" and a missing value alike, so "" works in both.
CONTINUE = ""
SLIDE_TYPES = (CONTINUE, "slide", "subslide", "fragment", "skip", "notes")
HIDDEN_SLIDE_TYPES = ("skip", "notes")
HIDE_INPUT = "hide-input"
SPEAKER_NOTES = "speaker-notes"
"""Tag of a ``notes`` cell written for the presenter (what to say and ask); collapsed in the notebook.
A ``notes`` cell without it is chapter text kept off the slides, open for students."""
"""Cell tag: the offline deck shows the cell's output without its code (the live deck shows the
cell collapsed, ``jupyter.source_hidden``; a click on the bar opens it)."""


def deck_slide_types(nb):
    """Give every cell of ``nb`` a slide type both the live deck and the exported slides read; in place.

    The rule, deterministic and idempotent (``tests/notebook_tools.py`` applies it whenever it
    writes a chapter):

    * a missing slide type and classic Notebook's ``"-"`` become :data:`CONTINUE` (``""``), the
      spelling jupyterlab-slideshow shows on the current slide (it hides ``"-"`` cells);
    * ``"subslide"`` becomes ``"slide"``: a presenter steps with → (or a clicker), and → skips
      reveal.js's vertical subslides in the live deck — every cell must be reachable by →;
    * the first code cell (the chapter's set-up) is never ``skip`` / ``notes``: it continues the
      title slide, so the presenter runs it from the first slide (``Shift+Enter``); its imports are
      not the point of a slide, so it is tagged :data:`HIDE_INPUT` and collapsed (its banner shows);
    * a ``notes`` cell tagged :data:`SPEAKER_NOTES` (the offline deck's speaker view, key S) is
      collapsed in the notebook, so a student's page stays the chapter.

    Args:
        nb: an ``nbformat.NotebookNode`` (v4).

    Returns:
        The same notebook.

    Raises:
        ValueError: a cell has a slide type outside :data:`SLIDE_TYPES` (after the rule above).
    """
    setup_seen = False
    for cell in nb.cells:
        show = cell.metadata.setdefault("slideshow", {})
        if show.get("slide_type") in (None, "-"):
            show["slide_type"] = CONTINUE
        if show["slide_type"] == "subslide":
            show["slide_type"] = "slide"
        if cell.cell_type == "code" and not setup_seen:
            setup_seen = True
            if show["slide_type"] in HIDDEN_SLIDE_TYPES:
                show["slide_type"] = CONTINUE
            tags = cell.metadata.setdefault("tags", [])
            if HIDE_INPUT not in tags:
                tags.append(HIDE_INPUT)
            cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
        if show["slide_type"] == "notes" and SPEAKER_NOTES in cell.metadata.get("tags", []):
            cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
        if show["slide_type"] not in SLIDE_TYPES:
            raise ValueError(f"slide_type must be one of {SLIDE_TYPES}, got {show['slide_type']!r} "
                             f"in cell {cell.get('id', '?')}")
    return nb


def speaker_view(source: str) -> str:
    """A speaker-notes cell's markdown as the offline deck's speaker view shows it: open. In the notebook
    the notes sit in a closed ``<details>`` block (JupyterLab does not collapse a rendered markdown cell,
    so a reader would otherwise see "Ask the room… Expected: …" above the demo it answers)."""
    return source.replace("<details>", "<details open>", 1)


def _package_dir(module: str) -> Path:
    import importlib

    return Path(importlib.import_module(module).__file__).resolve().parent


def vendor_sources() -> dict[str, Path]:
    """Where the local copies come from: ``{"reveal.js": dir, "mathjax": dir, "plotly.min.js": file}``.

    Raises:
        ModuleNotFoundError: a package of the ``slides`` extra is missing (``pip install -e ".[slides]"``).
    """
    return {
        "reveal.js": _package_dir("sphinx_revealjs") / "_static" / "revealjs",
        "mathjax": _package_dir("jupyter_server_mathjax") / "static",
        "plotly.min.js": _package_dir("plotly") / "package_data" / "plotly.min.js",
    }


def install_vendor(out_dir: Path) -> Path:
    """Copy reveal.js, MathJax and plotly.js into ``out_dir/vendor`` (idempotent); returns that folder."""
    vendor = Path(out_dir) / "vendor"
    vendor.mkdir(parents=True, exist_ok=True)
    for name, src in vendor_sources().items():
        dest = vendor / name
        if dest.exists():
            continue
        if src.is_dir():
            shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.map", "*.esm.js"))
        else:
            shutil.copy2(src, dest)
    return vendor


def _plotly_to_html_preprocessor():
    from nbconvert.preprocessors import Preprocessor

    from labsupport.widgets.snapshot import figure_html

    class PlotlyToHTML(Preprocessor):
        """Give every plotly output a static ``text/html`` chart (global ``Plotly``, no require.js), and
        a widget without a snapshot (not a :class:`~labsupport.widgets.snapshot.Panel`) a short note."""

        def preprocess_cell(self, cell, resources, index):
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if PLOTLY_MIME in data:
                    data["text/html"] = figure_html(data[PLOTLY_MIME])
                elif WIDGET_MIME in data and "text/html" not in data:
                    data["text/html"] = NO_SNAPSHOT_HTML.format(text=html.escape(no_snapshot_text()))
            return cell, resources

    return PlotlyToHTML


def edition_language(notebook: Path) -> str:
    """The language of a chapter: the one its set-up code chooses (``setup_chapter(..., lang="ko")`` or
    ``set_language("ko")``), else ``"ko"`` for a notebook in a ``*-ko`` folder (``chapters-ko/``), else
    ``"en"``. Read from the notebook, so an executed copy kept elsewhere exports in its own language."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            chosen = re.search(r"""(?:\blang\s*=\s*|set_language\(\s*)["']([a-z]{2})["']""", cell.source)
            if chosen and chosen.group(1) in LANGUAGES:
                return chosen.group(1)
    return "ko" if Path(notebook).resolve().parent.name.endswith("-ko") else "en"


def export(notebook: Path, out_dir: Path, *, execute: bool = True, timeout: int = 600,
           keep_executed: Path | None = None) -> Path:
    """Execute (unless ``execute=False``) and export one notebook; returns the written ``.slides.html``.

    ``keep_executed``: a folder to also write the executed notebook to (same file name), so a
    change of the template can be re-exported from it with ``execute=False`` in seconds.
    """
    import nbformat
    from nbconvert import SlidesExporter
    from nbconvert.preprocessors import ExecutePreprocessor
    from traitlets.config import Config

    notebook, out_dir = Path(notebook), Path(out_dir)
    install_vendor(out_dir)
    c = Config()
    c.SlidesExporter.template_name = "offline"
    c.SlidesExporter.extra_template_basedirs = [str(TEMPLATES)]
    c.SlidesExporter.reveal_url_prefix = "vendor/reveal.js"
    c.SlidesExporter.reveal_theme = "white"
    c.SlidesExporter.reveal_width = "1280"
    c.SlidesExporter.reveal_height = "800"
    c.SlidesExporter.mathjax_url = f"vendor/mathjax/MathJax.js?config={MATHJAX_CONFIG}"
    c.NbConvertBase.display_data_priority = DISPLAY_PRIORITY
    c.SlidesExporter.language_code = edition_language(notebook)   # <html lang="ko">: the browser picks Hangul fonts
    c.TagRemovePreprocessor.enabled = True                  # a quiz shows its panel, not the code with the answers
    c.TagRemovePreprocessor.remove_input_tags = {"quiz", HIDE_INPUT}   # …and the set-up its banner, not its imports
    nb = nbformat.read(notebook, as_version=4)
    if execute:
        os.environ["PLOTLY_RENDERER"] = "plotly_mimetype"     # the kernel inherits it: JSON figures only
        quiet = Config()
        if os.name != "nt":              # ipykernel warns "running over TCP without encryption" once a chapter
            quiet.KernelManager.transport = "ipc"        # a local socket file: no TCP port, no warning …
            quiet.KernelManager.ip = str(Path(tempfile.mkdtemp(prefix="labsupport-kernel-")) / "kernel")  # … absolute:
            # the kernel runs in the chapter's folder, the client here; a relative socket path would differ
        ep = ExecutePreprocessor(timeout=timeout, kernel_name="python3", store_widget_state=False, config=quiet)
        ep.preprocess(nb, {"metadata": {"path": str(notebook.parent)}})
        if keep_executed is not None:
            Path(keep_executed).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, Path(keep_executed) / notebook.name)
    for cell in nb.cells:                               # the presenter reads the notes open (key S)
        if cell.cell_type == "markdown" and SPEAKER_NOTES in cell.metadata.get("tags", []):
            cell.source = speaker_view(cell.source)
    exporter = SlidesExporter(config=c)
    exporter.register_preprocessor(_plotly_to_html_preprocessor(), enabled=True)
    with language(edition_language(notebook)):         # the deck's own words in its edition's language
        resources = {"metadata": {"name": notebook.stem}, "more_below": tr("▼ more below")}
        body, _ = exporter.from_notebook_node(nb, resources=resources)
    target = out_dir / f"{notebook.stem}.slides.html"
    target.write_text(body, encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("build/slides"))
    parser.add_argument("--no-execute", action="store_true", help="export the notebooks' saved outputs as they are")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument("--keep-executed", type=Path, default=None, metavar="DIR",
                        help="also save the executed notebooks in DIR (re-export them later with --no-execute)")
    args = parser.parse_args(argv)
    for nb in args.notebooks:
        start = time.perf_counter()
        target = export(nb, args.out, execute=not args.no_execute, timeout=args.timeout,
                        keep_executed=args.keep_executed)
        print(f"{nb} -> {target} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
