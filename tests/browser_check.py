"""Open chapters in real JupyterLab in headless Chromium, run all cells, operate every control.

    .venv/bin/python tests/browser_check.py chapters/01_sampling.ipynb [...] --out /tmp/shots [--repeat 2]

Needs Debian's ``chromium`` (``apt-get install chromium``) and the Python package
``playwright`` in the interpreter that runs this script (never ``playwright install``: the
system Chromium is used). JupyterLab is started from ``.venv`` on a free loopback port, on a scratch copy of the
notebooks (so autosave never writes outputs into the committed chapters).

For each notebook: clear the outputs and "Run All Cells"; with ``--repeat N`` then N − 1 times
"Restart Kernel and Run All Cells" (a busy machine's noise shows up as two runs that disagree).
A run ends when every code cell has a number in its prompt (or one stopped with a traceback).
Then every control of every panel is operated, one at a time, and the cell screenshotted
before and after (a control whose cell did not change is "no redraw"):
  sliders (keyboard End, or Home when already at the end), dropdowns and selects (another
  option), toggle buttons (every option, then back to the first), a toggle button and checkboxes
  (twice), radio buttons, text boxes (an empty text and a 40-digit number, each must show the red
  ⚠ line or be ignored, never a traceback; then a valid value: the old one, the placeholder's
  "e.g." example or "1"), buttons, play widgets (play, then pause).
Saved under ``--out/<notebook stem>/``:
  ``00_after_run_all_R.png``        the page after run R;
  ``outputs_runR.json``             every code cell's output text after run R (compare the prose of two runs);
  ``cell_NN_runR.png``              every cell holding a widget panel or a plotly figure, after run R;
  ``cell_NN_<kind>_K<label>.png``   the cell after operating its K-th control of that kind;
  ``console.txt``                   every browser console message (all types).
The report of each notebook is printed as soon as it is done (Run All seconds per run, controls
operated by kind, tracebacks, no-redraws, what each invalid text showed, console errors); the
notebook is then closed and its kernel shut down. A widget callback that raises outside any
cell output lands in JupyterLab's log console: a growing log count counts as a traceback.
A plotly chart drawn without any trace (empty axes: a FigureWidget that rendered before its data
arrived) is reported per run as a blank figure. Exit code 1 on a traceback, a run that did not
finish, a control that did not redraw, a blank figure, a widget label or button whose text is cut
off (``cut_labels``: wider than its box), or a console error.

Slides:

``--deck``: after "Run All" the notebook is presented with jupyterlab-slideshow ("Toggle Deck") in a
``--deck-size`` viewport (default 1280x720, a projector); the check steps through the deck with its
on-screen remote. It runs the set-up cell from its slide (Shift+Enter: ``deck_setup.png``,
``deck_setup_ran.png``), and on every slide that shows a live panel (an ipywidgets slider, with its
plotly FigureWidgets) saves ``deck_NN.png``, moves the panel's first slider and saves
``deck_NN_slider.png``; ``deck_step_NN.png`` is every step. Each notebook's report is printed as soon
as it is done, then its tab is closed and its kernel shut down. Exit code 1 (``deck_failed``) when no
panel was live on a slide, a panel cell of the notebook never appeared on a slide, a panel did not
redraw, was wider than the viewport or shown as text, showed a blank figure (axes only: no title,
point, line, bar or shape), or the set-up did not run from its slide.
Panels taller than the viewport (they scroll) are listed in ``deck_taller_than_screen``.

``--offline build/slides/01_sampling.slides.html [...]``: no JupyterLab; each exported deck is
opened from disk in a browser context with networking disabled, stepped through slide by slide
(``offline_<stem>_NN.png``), and the report counts slides, typeset formulas, drawn plotly
charts and panel snapshots, and lists every request that was not a local file, every widget
shown as text (``VBox(...)``) and console errors. It also lists, under ``cut``, every slide whose
content was never wholly on screen (some edge stayed outside the slide area at every step spent
on it; a slide that scrolls must be scrolled to its end by the advancing key), counts slides
shrunk to fit / scrolling, plotly charts left undrawn and MathJax errors. ``--offline-viewport
1280x720`` (or ``1920x1080``) sets the window. Exit code 1 when any problem is found or a deck
does not advance.

This is a maintainer's check, not part of ``make test`` (CI has no browser).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(port: int, root_dir: Path) -> subprocess.Popen:
    """JupyterLab on ``root_dir`` (a scratch copy: autosave must never touch the committed chapters)."""
    jupyter = ROOT / ".venv" / "bin" / "jupyter"
    if not jupyter.exists():                       # e.g. a git worktree using another checkout's venv
        jupyter = Path(sys.executable).parent / "jupyter"
    cmd = [str(jupyter), "lab", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
           "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
           f"--ServerApp.root_dir={root_dir}", f"--LabApp.workspaces_dir={root_dir / '.workspaces'}", f"--LabApp.user_settings_dir={root_dir / '.user-settings'}", "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    env = {**os.environ, "JUPYTERLAB_WORKSPACES_DIR": str(root_dir / ".workspaces")}
    # every cell rendered, not only those near the viewport: a deck shows cells far down the notebook
    tracker = root_dir / ".user-settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    log = open(f"/tmp/browser_check_lab_{port}.log", "w")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root_dir, start_new_session=True,
                            env=env)
    for _ in range(120):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"JupyterLab did not start; see /tmp/browser_check_lab_{port}.log")


def wait_idle(page, timeout_s: float) -> bool:
    """Wait until no cell shows the busy prompt ``[*]``."""
    deadline = time.time() + timeout_s
    time.sleep(2)
    while time.time() < deadline:
        busy = page.evaluate("""() => Array.from(document.querySelectorAll('.jp-InputPrompt'))
                                 .filter(e => e.textContent.includes('[*]')).length""")
        if busy == 0:
            return True
        time.sleep(1)
    return False


# --- controls: every kind the panels use -------------------------------------------------------
# ipywidgets 8 DOM: a selector for each control kind (what `operate` does to it is below).
CONTROL_KINDS = {
    "slider": ".widget-slider .noUi-handle",
    "dropdown": ".widget-dropdown select",
    "select": ".widget-select select",
    "toggle_buttons": ".widget-toggle-buttons",
    "toggle_button": "button.widget-toggle-button:not(.widget-toggle-buttons *)",
    "checkbox": ".widget-checkbox input[type=checkbox]",
    "radio": ".widget-radio-box",
    "text": ".widget-text input[type=text], .widget-textarea textarea",
    "button": "button.widget-button:not(.widget-play *)",
    "play": ".widget-play",
}
#: what a text box receives before its valid value comes back: nothing, and a huge number
INVALID_TEXTS = ("", "9" * 40)
CELL_OF = "e => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).indexOf(e.closest('.jp-Cell'))"


def log_count(page) -> int:
    """Messages in JupyterLab's log console (output of a widget callback outside any cell lands there)."""
    text = page.evaluate("() => (document.querySelector('.jp-LogConsoleStatusItem') || {}).textContent || ''")
    m = re.search(r"(\d+)", text)
    return int(m.group(1)) if m else 0


def settle(page, seconds: float = 2.0, timeout_s: float = 90.0) -> None:
    """Let a callback run: a short sleep, then wait for the kernel to go idle."""
    time.sleep(seconds)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        status = page.evaluate("""() => { const e = document.querySelector('.jp-Notebook-ExecutionIndicator');
                                          return e ? e.getAttribute('data-status') : 'idle'; }""")
        if status in (None, "idle"):
            break
        time.sleep(0.5)
    time.sleep(0.5)


def cell_problem(cell) -> str | None:
    text = cell.inner_text()
    if "Traceback" in text:
        return text[-800:]
    return None


def valid_text_for(box, original: str) -> str:
    """A value the box accepts: the one it had, else the placeholder's example, else a number."""
    if original.strip():
        return original
    hint = box.get_attribute("placeholder") or ""
    m = re.search(r"e\.g\.\s*(.+)$", hint)
    if m:
        return m.group(1).strip()
    return "1"


def operate_cell(page, cell, i: int, out: Path, report: dict, log) -> None:
    """Operate every control of one cell's panel, one at a time, comparing screenshots around each."""
    def shot(name: str | None = None) -> bytes:
        with contextlib.suppress(Exception):
            cell.scroll_into_view_if_needed(timeout=5000)
        return cell.screenshot(path=str(out / name) if name else None)

    def after(kind: str, k: int, before: bytes, label: str, wait: float = 2.0) -> bytes:
        settle(page, wait)
        now = shot(f"cell_{i:02d}_{kind}_{k}{label}.png")
        report["controls"][kind] = report["controls"].get(kind, 0) + 1
        problem = cell_problem(cell)
        if problem:
            report["tracebacks"].append({"cell": i, "after": f"{kind} {k}{label}", "text": problem})
        if log_count(page) > report["log_messages"]:
            report["log_messages"] = log_count(page)
            report["tracebacks"].append({"cell": i, "after": f"{kind} {k}{label}",
                                         "text": "new message(s) in the log console (a callback raised?)"})
        if now == before:
            report["no_redraw"].append(f"cell {i} {kind} {k}{label}")
        log(f"    cell {i:2d} {kind} {k}{label}: {'redrawn' if now != before else 'NO REDRAW'}"
            f"{' TRACEBACK' if problem else ''}")
        return now

    for k, handle in enumerate(cell.query_selector_all(CONTROL_KINDS["slider"])):
        if not handle.is_visible():          # e.g. the temperature panel's edit sliders in the model mode
            continue
        if handle.evaluate("h => !!h.closest('[disabled], .mod-disabled')"):   # greyed out by the panel on purpose
            log(f"    cell {i:2d} slider {k}: disabled by the panel, skipped")
            continue
        before = shot()
        start_value = handle.get_attribute("aria-valuenow")
        handle.focus()
        handle.press("End")
        if handle.get_attribute("aria-valuenow") == start_value:   # already at the top: go down
            handle.press("Home")
        if handle.get_attribute("aria-valuenow") == start_value:
            report["no_redraw"].append(f"cell {i} slider {k}: slider did not move")
        after("slider", k, before, "", 2.5)

    for kind in ("dropdown", "select"):
        for k, sel in enumerate(cell.query_selector_all(CONTROL_KINDS[kind])):
            if not sel.is_visible() or sel.is_disabled():        # a control the panel greyed out on purpose
                continue
            options = sel.evaluate("s => Array.from(s.options).map(o => o.value)")
            current = sel.evaluate("s => s.value")
            others = [o for o in options if o != current]
            if not others:
                continue
            before = shot()
            sel.select_option(others[-1])
            after(kind, k, before, "")
            sel.select_option(current)                 # back to where it started, so later controls (and the deck) act
            time.sleep(1.0)

    for k, group in enumerate(cell.query_selector_all(CONTROL_KINDS["toggle_buttons"])):
        if not group.is_visible():
            continue
        def live(b) -> bool:
            """Still on the page and enabled: a Predict panel locks (re-renders) its buttons once a
            prediction meets a measurement already made."""
            from playwright.sync_api import Error as PlaywrightError

            try:
                return not b.is_disabled()
            except PlaywrightError:
                return False

        buttons = [b for b in group.query_selector_all("button") if b.is_visible()]
        start = next((j for j, b in enumerate(buttons) if "mod-active" in (b.get_attribute("class") or "")), 0)
        for j, b in enumerate(buttons):
            if not live(b) or "mod-active" in (b.get_attribute("class") or ""):
                continue
            before = shot()
            b.click()
            after("toggle_buttons", k, before, f"_option_{j}")
        if buttons and live(buttons[start]) \
                and "mod-active" not in (buttons[start].get_attribute("class") or ""):   # back to the start
            before = shot()
            buttons[start].click()
            after("toggle_buttons", k, before, "_back")

    for k, b in enumerate(cell.query_selector_all(CONTROL_KINDS["toggle_button"])):
        if not b.is_visible():
            continue
        for label in ("_off", "_on"):                 # twice: it ends as it started
            before = shot()
            b.click()
            after("toggle_button", k, before, label)

    for k, box in enumerate(cell.query_selector_all(CONTROL_KINDS["checkbox"])):
        if box.is_visible():
            for label in ("_a", "_b"):
                before = shot()
                box.click()
                after("checkbox", k, before, label)

    for k, group in enumerate(cell.query_selector_all(CONTROL_KINDS["radio"])):
        radios = [r for r in group.query_selector_all("input[type=radio]") if r.is_visible()]
        others = [r for r in radios if not r.is_checked()]
        if others:
            before = shot()
            others[-1].click()
            after("radio", k, before, "")

    for k, box in enumerate(cell.query_selector_all(CONTROL_KINDS["text"])):
        if not box.is_visible():
            continue
        original = box.input_value()
        for j, bad in enumerate(INVALID_TEXTS):
            if bad == original:
                continue
            before = shot()
            box.fill(bad)
            box.press("Enter")
            now = after("text", k, before, f"_invalid_{j}")
            shown = "⚠" in cell.inner_text() or "✗" in cell.inner_text()      # a panel's error, or a quiz's ✗ reason
            report["invalid_inputs"].append({"cell": i, "text": k, "input": bad[:12] or "(empty)",
                                             "message": shown, "ignored": now == before})
            if now == before:                      # ignored (e.g. an empty quiz answer): not a missing redraw
                report["no_redraw"].remove(f"cell {i} text {k}_invalid_{j}")
            log(f"      input {bad[:12] or '(empty)'!r}: {'message shown' if shown else 'no message'}"
                f"{' (ignored)' if now == before else ''}")
        good = valid_text_for(box, original)
        before = shot()
        box.fill(good)
        box.press("Enter")
        after("text", k, before, "_valid")
        buttons = cell.query_selector_all(CONTROL_KINDS["button"])     # a quiz box answers on its button
        if "⚠" in cell.inner_text() and not buttons:
            report["tracebacks"].append({"cell": i, "after": f"text {k} valid {good!r}",
                                         "text": "the error line stays after a valid value"})

    for k, button in enumerate(cell.query_selector_all(CONTROL_KINDS["button"])):
        if not button.is_visible():
            continue
        before = shot()
        try:
            button.click(timeout=5000)
        except Exception as err:  # noqa: BLE001 - report and go on
            report["tracebacks"].append({"cell": i, "text": f"button {k} not clickable: {err}"})
            continue
        after("button", k, before, "", 3.0)

    for k, play in enumerate(cell.query_selector_all(CONTROL_KINDS["play"])):
        buttons = play.query_selector_all("button")
        if not buttons or not buttons[0].is_visible():
            continue
        before = shot()
        buttons[0].click()                          # play ...
        time.sleep(2.0)
        if len(buttons) > 1:
            buttons[1].click()                      # ... pause
        after("play", k, before, "")


def blank_figures(page) -> list[int]:
    """Cells holding a drawn plotly chart with no trace, shape or annotation (a FigureWidget that
    rendered empty axes; a diagram made only of shapes and annotations is not blank)."""
    time.sleep(2)
    return page.evaluate("""() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).map((c, i) =>
        Array.from(c.querySelectorAll('.js-plotly-plot')).some(p => p._fullLayout && (!p.data || p.data.length === 0)
            && !(p._fullLayout.shapes || []).length && !(p._fullLayout.annotations || []).length)
        ? i : -1).filter(i => i >= 0)""")


def cut_labels(page) -> list[dict]:
    """Widget labels and buttons whose text is cut off (wider than their box: ipywidgets shows an
    ellipsis) — a translated label that does not fit, for instance. One entry per cell and text."""
    return page.evaluate("""() => {
        const cells = Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell'));
        const found = [];
        cells.forEach((c, i) => c.querySelectorAll('.jp-OutputArea .widget-label, .jp-OutputArea button.jupyter-button')
            .forEach(e => { if (e.offsetParent !== null && e.textContent.trim() && e.scrollWidth > e.clientWidth + 1)
                found.push({cell: i, text: e.textContent.trim().slice(0, 80), width: e.clientWidth, needs: e.scrollWidth}); }));
        return found;
    }""")


def outputs_text(page) -> list[dict]:
    """Every code cell's output as text (to compare the prose of two runs)."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).map((c, i) => ({
        cell: i, code: c.classList.contains('jp-CodeCell'),
        source: ((c.querySelector('.jp-InputArea-editor') || {}).innerText || '').split('\\n')[0].slice(0, 100),
        output: ((c.querySelector('.jp-OutputArea') || {}).innerText || '')})).filter(c => c.code)""")


def wait_run_all(page, timeout_s: float) -> bool:
    """Wait until every code cell has run (a number in its prompt) or Run All stopped at an error.

    Stable for three polls in a row: no ``[*]``, and no ``[ ]`` left unless a traceback ended the run.
    """
    deadline = time.time() + timeout_s
    stable = 0
    time.sleep(2)
    while time.time() < deadline:
        state = page.evaluate("""() => {
            const p = Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')).map(e => e.textContent);
            return {busy: p.filter(t => t.includes('[*]')).length, todo: p.filter(t => /\\[\\s*\\]/.test(t)).length,
                    error: Array.from(document.querySelectorAll('.jp-OutputArea-output[data-mime-type*="stderr"]'))
                          .filter(e => /Traceback|Error/.test(e.textContent)).length};
        }""")
        done = state["busy"] == 0 and (state["todo"] == 0 or state["error"] > 0)
        stable = stable + 1 if done else 0
        if stable >= 3:
            return True
        time.sleep(1)
    return False


def run_all(page, run_timeout: float, restart: bool) -> tuple[bool, float]:
    """Clear every output, then Run All Cells (or Restart Kernel and Run All); seconds until all ran."""
    page.click("li.lm-MenuBar-item:has-text('Edit')")
    page.click(".lm-Menu-item:has-text('Clear Outputs of All Cells')")
    time.sleep(1)
    page.click("li.lm-MenuBar-item:has-text('Kernel')" if restart else "li.lm-MenuBar-item:has-text('Run')")
    if restart:
        page.click(".lm-Menu-item:has-text('Restart Kernel and Run All Cells')")
        page.locator(".jp-Dialog .jp-mod-accept").first.click(timeout=10_000)
    else:
        page.click(".lm-Menu-item:has-text('Run All Cells')")
    started = time.time()
    finished = wait_run_all(page, run_timeout)
    return finished, round(time.time() - started - 2, 1)     # less the three polls that confirmed the end


def check_notebook(page, port: int, nb: str, out: Path, run_timeout: float, skip_panels: bool = False,
                   repeat: int = 1, log=print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    report = {"notebook": nb, "tracebacks": [], "no_redraw": [], "controls": {}, "invalid_inputs": [],
              "run_all_seconds": [], "finished": True, "log_messages": 0, "blank_figures": [], "cut_labels": []}
    page.goto(f"http://127.0.0.1:{port}/lab/tree/{nb}", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle'], .jp-Toolbar", timeout=60_000)
    time.sleep(3)
    with contextlib.suppress(Exception):  # dismiss the "Jupyter news?" toast, when it is shown
        page.locator(".jp-toast-button:has-text('No')").first.click(timeout=3000)
    for run in range(1, repeat + 1):
        finished, seconds = run_all(page, run_timeout, restart=run > 1)
        report["run_all_seconds"].append(seconds)
        report["finished"] &= finished
        time.sleep(2)
        page.screenshot(path=str(out / f"00_after_run_all_{run}.png"), full_page=False)
        texts = outputs_text(page)
        (out / f"outputs_run{run}.json").write_text(json.dumps(texts, indent=1, ensure_ascii=False))
        cells = page.query_selector_all(".jp-Notebook .jp-Cell")
        for i, cell in enumerate(cells):
            text = cell.inner_text()
            if "Traceback" in text or "Error:" in text and cell.query_selector("[data-mime-type*='stderr']"):
                report["tracebacks"].append({"cell": i, "run": run, "text": text[-800:]})
            if cell.query_selector(".js-plotly-plot, .jupyter-widgets, .widget-slider, .widget-button"):
                with contextlib.suppress(Exception):
                    cell.scroll_into_view_if_needed(timeout=5000)
                time.sleep(0.3)
                cell.screenshot(path=str(out / f"cell_{i:02d}_run{run}.png"))
        blank = blank_figures(page)
        if blank:
            report["blank_figures"].append({"run": run, "cells": blank})
        cut = [c for c in cut_labels(page) if c not in report["cut_labels"]]
        report["cut_labels"] += cut
        if cut:
            log(f"  run {run}: {len(cut)} label(s) cut off: {cut[:5]}")
        log(f"  run {run}: {'finished' if finished else 'NOT FINISHED'} in {seconds} s, "
            f"{len(blank)} blank figure(s) {blank if blank else ''}, "
            f"{len(report['tracebacks'])} traceback(s) so far")
    report["log_messages"] = log_count(page)
    if report["log_messages"]:
        report["tracebacks"].append({"cell": None, "text": f"{report['log_messages']} message(s) in the log console"})
    if skip_panels:
        return report
    cells = page.query_selector_all(".jp-Notebook .jp-Cell")
    for i, cell in enumerate(cells):
        if not cell.query_selector(", ".join(CONTROL_KINDS.values())):
            continue
        log(f"  cell {i}: operating its controls")
        operate_cell(page, cell, i, out, report, log)
    return report


# a live panel: a cell whose output holds an ipywidgets slider (its figures are plotly FigureWidgets)
PANEL_CELLS_JS = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).map((c, i) =>
    c.querySelector('.jp-OutputArea .widget-slider') ? i : -1).filter(i => i >= 0)"""
CELL_OF_JS = "e => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).indexOf(e.closest('.jp-Cell'))"
ACTIVE_JS = "() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).findIndex(c => c.classList.contains('jp-mod-active'))"


def _deck_go(page) -> bool:
    """Press the deck's on-screen remote: next subslide/fragment, else next slide; False at the end."""
    for direction in ("down", "forward"):
        button = page.locator(f".jp-deck-mod-direction-{direction}").first
        if "jp-mod-disabled" not in (button.get_attribute("class") or ""):
            button.click()
            return True
    return False


def _deck_run_setup(page, cell_index: int, report: dict) -> None:
    """Run the set-up cell from its slide (Shift+Enter on the active cell, as a presenter does)."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(cell_index)
    classes = cell.get_attribute("class") or ""
    report["deck_setup_on_slide"] = "jp-deck-mod-onscreen" in classes and "jp-deck-mod-visible" in classes
    # the set-up's input is collapsed (labsupport.slides), so its prompt shows no count: a run is seen
    # by its output being drawn anew (the marked output node is replaced by a fresh one)
    had = cell.evaluate("e => { const o = e.querySelector('.jp-OutputArea-output');"
                        " if (o) { o.dataset.bcMark = '1'; } return !!o; }")
    cell.evaluate("e => e.focus()")
    page.keyboard.press("Shift+Enter")
    time.sleep(2)
    wait_idle(page, 120)
    fresh = cell.evaluate("e => { const o = e.querySelector('.jp-OutputArea-output');"
                          " return !!o && !o.dataset.bcMark; }")
    text = cell.inner_text()
    report["deck_setup_ran"] = fresh and "Traceback" not in text
    report["deck_setup_prompt"] = f"output before: {had}, drawn anew: {fresh}"


def _panel_box(cell) -> dict:
    """Where the panel (the cell's output area) lies in the viewport, in CSS pixels."""
    return cell.evaluate("""e => { const o = e.querySelector('.jp-Cell-outputArea') || e;
        const r = o.getBoundingClientRect();
        return {left: Math.round(r.left), top: Math.round(r.top), right: Math.round(r.right),
                bottom: Math.round(r.bottom), width: Math.round(r.width), height: Math.round(r.height),
                scroll_width: o.scrollWidth, client_width: o.clientWidth,
                figures: Array.from(e.querySelectorAll('.js-plotly-plot')).filter(f =>
                    f.getBoundingClientRect().width > 50 && f.getBoundingClientRect().height > 50).length,
                blank: Array.from(e.querySelectorAll('.js-plotly-plot')).filter(f => !f.querySelector(
                    'path.point, path.js-line, .bars path, .shapelayer path, .main-svg image, .gtitle')).length}; }""")


def _deck_ensure_ran(page, run_timeout: float) -> int:
    """Cells with an execution count; when none has one (Run All sent before the kernel was up), run all again."""
    count_js = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt'))
                  .filter(e => /\\[\\d+\\]/.test(e.textContent)).length"""
    ran = page.evaluate(count_js)
    if ran == 0:
        with contextlib.suppress(Exception):
            page.locator(".jp-toast-button:has-text('No')").first.click(timeout=2000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        page.click("li.lm-MenuBar-item:has-text('Run')")
        page.click(".lm-Menu-item:has-text('Run All Cells')")
        time.sleep(5)
        wait_idle(page, run_timeout)
        time.sleep(2)
        ran = page.evaluate(count_js)
    return ran


ONSCREEN_JS = ("() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).map((c, i) => "
               "c.classList.contains('jp-deck-mod-onscreen') ? i : -1).filter(i => i >= 0)")


def check_deck_keys(page, notebook: Path, key: str = "ArrowRight", max_steps: int = 200,
                    size: tuple[int, int] = (1280, 720), out: Path | None = None) -> dict:
    """Present the open notebook and step with ``key`` only (a presenter's →, a clicker): every cell
    that is not ``skip`` / ``notes`` must come on screen. Reports the cells never shown."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    expected = [i for i, c in enumerate(nb["cells"])
                if c.get("metadata", {}).get("slideshow", {}).get("slide_type") not in ("skip", "notes")]
    if page.evaluate("() => document.body.dataset.jpDeckMode === 'presenting'"):
        page.click("[data-command='deck:toggle']")               # leave the deck the panel check left on
        time.sleep(2)
    page.set_viewport_size({"width": size[0], "height": size[1]})
    page.evaluate("() => document.querySelector('.jp-WindowedPanel-outer, .jp-Notebook').scrollTo(0, 0)")
    page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Escape")
    page.click("[data-command='deck:toggle']")
    time.sleep(3)
    shown, still, last = set(), 0, None
    focus = []
    for k in range(max_steps):
        on = page.evaluate(ONSCREEN_JS)
        shown.update(on)
        now = (on, page.evaluate(ACTIVE_JS))          # the end: neither the slide nor the active cell moves
        focus.append(page.evaluate("() => (document.activeElement || {}).className || ''")[:60])
        if out is not None:
            page.screenshot(path=str(out / f"deck_key_{k:02d}.png"))
        still = still + 1 if now == last else 0
        if still >= 3:
            break
        last = now
        page.keyboard.press(key)
        time.sleep(0.6)
    page.click("[data-command='deck:toggle']")
    time.sleep(1)
    return {"deck_key": key, "deck_key_cells_expected": len(expected),
            "deck_key_cells_never_shown": [i for i in expected if i not in shown], "deck_key_focus": focus[-4:]}


def check_deck(page, out: Path, max_slides: int = 150, size: tuple[int, int] = (1280, 720),
               run_timeout: float = 240.0) -> dict:
    """Present the open notebook with jupyterlab-slideshow; prove each live panel works on a slide.

    The notebook has run (check_notebook). Its panel cells (an output holding an ipywidgets
    slider) are listed first. The viewport becomes ``size`` (a projector), the deck starts at the
    title cell and advances with its on-screen remote until the end. On the way: the first code
    cell (the set-up) is run from its slide with Shift+Enter; on each slide showing a panel not
    seen before, the panel is scrolled into view, ``deck_NN.png`` is saved, its first visible
    slider is moved (End, or Home at the end) and ``deck_NN_slider.png`` saved. Reported:
    panels seen on slides, panels that did not redraw, panel cells never shown on a slide,
    panels wider than the viewport (cut off), panels taller than it (need scrolling), widgets
    shown as text, and whether the set-up ran on its slide.
    """
    report = {"deck_size": f"{size[0]}x{size[1]}", "deck_steps": 0, "deck_panels": 0, "deck_panel_cells": [],
              "deck_figures": 0, "deck_no_redraw": [], "deck_blank_figures": [], "deck_missing_panels": [], "deck_cut_off": [],
              "deck_taller_than_screen": [], "deck_text_widgets": 0, "deck_setup_on_slide": None,
              "deck_setup_ran": None}
    report["deck_cells_run"] = _deck_ensure_ran(page, run_timeout)
    with contextlib.suppress(Exception):             # the news toast sits over the deck's remote
        page.locator(".jp-toast-button:has-text('No')").first.click(timeout=2000)
    panel_cells = page.evaluate(PANEL_CELLS_JS)
    setup = page.evaluate("() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell'))"
                          ".findIndex(c => c.classList.contains('jp-CodeCell'))")
    page.set_viewport_size({"width": size[0], "height": size[1]})
    page.evaluate("() => document.querySelector('.jp-WindowedPanel-outer, .jp-Notebook').scrollTo(0, 0)")
    time.sleep(1)
    # the deck starts at the active cell: the title (its prompt area, not its collapser, which would fold it)
    page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Escape")
    page.click("[data-command='deck:toggle']")
    time.sleep(3)
    seen: set[int] = set()
    for k in range(max_slides):
        report["deck_steps"] = k + 1
        page.evaluate("() => document.activeElement && document.activeElement.blur()")
        report["deck_text_widgets"] += sum(t.is_visible() for t in page.get_by_text("VBox(children=").all())
        active = page.evaluate(ACTIVE_JS)
        if active == setup and report["deck_setup_ran"] is None:
            page.screenshot(path=str(out / "deck_setup.png"))
            _deck_run_setup(page, setup, report)      # Shift+Enter also advances the deck
            page.screenshot(path=str(out / "deck_setup_ran.png"))
            continue
        for handle in page.locator(".jp-deck-mod-onscreen.jp-deck-mod-visible .widget-slider .noUi-handle").all():
            cell_index = handle.evaluate(CELL_OF_JS)
            if cell_index in seen or not handle.is_visible() \
                    or handle.evaluate("h => !!h.closest('[disabled], .mod-disabled')"):   # greyed out: try the next
                continue
            seen.add(cell_index)
            cell = page.locator(".jp-Notebook .jp-Cell").nth(cell_index)
            cell.locator(".jp-Cell-outputArea").first.evaluate("e => e.scrollIntoView({block: 'start'})")
            time.sleep(0.5)
            box = _panel_box(cell)
            report["deck_panels"] += 1
            report["deck_panel_cells"].append(cell_index)
            report["deck_figures"] += box["figures"]
            if box["blank"]:                         # axes drawn, but no title, point, line, bar or shape
                report["deck_blank_figures"].append(f"cell {cell_index}: {box['blank']} blank figure(s)")
            if box["right"] > size[0] or box["left"] < 0 or box["scroll_width"] > box["client_width"] + 2:
                report["deck_cut_off"].append(f"cell {cell_index}: {box}")
            if box["height"] > size[1]:
                report["deck_taller_than_screen"].append(f"cell {cell_index}: {box['height']} px")
            panel = cell.locator(".jp-Cell-outputArea").first
            page.screenshot(path=str(out / f"deck_{k:02d}.png"))
            before = panel.screenshot()
            start = handle.get_attribute("aria-valuenow")
            handle.focus()
            handle.press("End")
            if handle.get_attribute("aria-valuenow") == start:
                handle.press("Home")
            time.sleep(3)
            wait_idle(page, 60)
            page.screenshot(path=str(out / f"deck_{k:02d}_slider.png"))
            after = panel.screenshot()
            if handle.get_attribute("aria-valuenow") == start:
                report["deck_no_redraw"].append(f"deck step {k} (cell {cell_index}): slider did not move")
            elif after == before:
                report["deck_no_redraw"].append(f"deck step {k} (cell {cell_index})")
            page.evaluate("() => document.activeElement && document.activeElement.blur()")
            break                                    # one panel per step: the next step shows the next one
        page.screenshot(path=str(out / f"deck_step_{k:02d}.png"))
        if not _deck_go(page):
            break                                   # both disabled: the last slide
        time.sleep(1.0)
    page.screenshot(path=str(out / "deck_last.png"))
    report["deck_missing_panels"] = [i for i in panel_cells if i not in seen]
    report["deck_notebook_panels"] = len(panel_cells)
    return report


def deck_failed(report: dict) -> bool:
    """A deck check fails when no panel (or not every panel) was live on a slide, or the set-up did not run."""
    return (report["deck_panels"] == 0 or bool(report["deck_missing_panels"]) or bool(report["deck_no_redraw"])
            or bool(report["deck_text_widgets"]) or bool(report["deck_cut_off"]) or bool(report["deck_blank_figures"])
            or not report["deck_setup_on_slide"] or not report["deck_setup_ran"])


def close_notebook(page, port: int, viewport: dict) -> int:
    """Leave the deck, close every tab (discarding changes) and shut the kernels down before the next notebook.

    Returns the notebook tabs still open after "Close All Tabs" (0 when all closed). The page then
    goes to ``about:blank`` before the kernels stop, so no widget view is left to sync with a dead kernel.
    """
    # leave the deck with its "Exit Deck" button: the deck's "active" setting persists, and a deck left
    # on would come back (top bar hidden) when the next notebook's page loads
    with contextlib.suppress(Exception):
        page.locator(".jp-Deck-Remote .jp-deck-mod-stop").first.click(timeout=5000)
        page.wait_for_function("() => document.body.dataset.jpDeckMode !== 'presenting'", timeout=10_000)
        time.sleep(1)
    with contextlib.suppress(Exception):
        page.click("li.lm-MenuBar-item:has-text('File')")
        page.click(".lm-Menu-item:has-text('Close All Tabs')", timeout=5000)
        time.sleep(1)
        for _ in range(5):                           # "Save your work?" for each changed notebook
            button = page.locator(".jp-Dialog-button:has-text('Discard'), .jp-Dialog-button:has-text(\"Don't Save\")")
            if not button.count():
                break
            button.first.click()
            time.sleep(0.5)
    left = page.locator(".jp-NotebookPanel").count()
    page.goto("about:blank")
    with contextlib.suppress(OSError):
        base = f"http://127.0.0.1:{port}/api/sessions"
        for session in json.loads(urllib.request.urlopen(base, timeout=10).read()):
            urllib.request.urlopen(urllib.request.Request(f"{base}/{session['id']}", method="DELETE"), timeout=30)
    page.set_viewport_size(viewport)                 # only now: a resize makes live figures sync with the kernel
    return left


# Where the present slide's content lies, in viewport pixels, and the part of it one can see now:
# the slide area (reveal.js's scaled 1280x800 box) cut by the viewport and, for a slide that
# scrolls, by its own box. Each element's box is cut by its clipping ancestors (a code cell's
# horizontal scroller hides long lines on purpose); a plot's or a formula's inside is not walked.
SLIDE_EXTENT_JS = """() => {
  const slide = Reveal.getCurrentSlide(), area = Reveal.getSlidesElement().getBoundingClientRect();
  const view = {top: 0, left: 0, bottom: innerHeight, right: innerWidth};
  const own = slide.getBoundingClientRect(), scrolls = /auto|scroll/.test(getComputedStyle(slide).overflowY);
  const seen = {top: Math.max(view.top, area.top, scrolls ? own.top : -1e9) - 2,
                bottom: Math.min(view.bottom, area.bottom, scrolls ? own.bottom : 1e9) + 2,
                left: Math.max(view.left, area.left) - 2, right: Math.min(view.right, area.right) + 2};
  const clips = new Map();
  function clipOf(e) {                        // the box e's ancestors below the slide let it show in
    if (!e || e === slide) return {top: -1e9, left: -1e9, bottom: 1e9, right: 1e9};
    if (clips.has(e)) return clips.get(e);
    let c = clipOf(e.parentElement);
    if (getComputedStyle(e).overflow !== 'visible') {
      const r = e.getBoundingClientRect();
      c = {top: Math.max(c.top, r.top), left: Math.max(c.left, r.left),
           bottom: Math.min(c.bottom, r.bottom), right: Math.min(c.right, r.right)};
    }
    clips.set(e, c);
    return c;
  }
  const box = {top: 1e9, left: 1e9, bottom: -1e9, right: -1e9};
  for (const e of slide.querySelectorAll(':scope *:not(svg *):not(.js-plotly-plot *):not(.MathJax *):not(.MathJax_Display *)')) {
    const r = e.getBoundingClientRect();
    if (!r.width || !r.height || getComputedStyle(e).visibility === 'hidden') continue;
    const c = clipOf(e.parentElement);
    const top = Math.max(r.top, c.top), bottom = Math.min(r.bottom, c.bottom);
    const left = Math.max(r.left, c.left), right = Math.min(r.right, c.right);
    if (bottom <= top || right <= left) continue;         // scrolled out of its own scroller: not cut
    box.top = Math.min(box.top, top); box.bottom = Math.max(box.bottom, bottom);
    box.left = Math.min(box.left, left); box.right = Math.max(box.right, right);
  }
  const i = Reveal.getIndices();
  return {slide: `${i.h}/${i.v || 0}`, box, seen, zoom: slide.style.zoom || '1', scrolls: scrolls && slide.scrollHeight > slide.clientHeight};
}"""


def check_offline(browser, html: Path, out: Path, viewport: tuple[int, int] = (1280, 800),
                  key: str = "Space") -> dict:
    """Open an exported deck from disk with networking disabled and step through every slide with
    ``key`` (``"Space"`` or ``"ArrowRight"``: a presenter uses either; both must reach every slide).

    Besides the counts of the module docstring, ``cut`` lists every slide whose content was never
    wholly on screen: its top, bottom, left or right edge lay outside the slide area (in the
    ``viewport``) at every step spent on that slide (a slide that scrolls must have been scrolled
    to its end by the keys that advance). ``fitted`` / ``scrolled`` count slides shrunk to fit and
    slides that scroll; ``plots_undrawn`` counts plotly charts without an SVG, ``math_errors``
    MathJax's error boxes.
    """
    out.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, offline=True)
    page = context.new_page()
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    page.goto(html.resolve().as_uri())
    time.sleep(4)
    total = page.evaluate("() => Reveal.getTotalSlides()")
    report = {"deck": str(html), "key": key, "viewport": f"{viewport[0]}x{viewport[1]}", "slides": total,
              "advanced": 0, "slides_seen": 0, "notes": 0,
              "math": 0, "math_errors": 0, "plots": 0, "plots_undrawn": 0, "snapshots": 0, "text_widgets": 0,
              "fitted": 0, "scrolled": 0, "reached_end": False}
    last = None
    extents: dict[str, list[dict]] = {}
    for k in range(4 * total + 20):              # fragments and scrolling take steps too; stop after the last slide
        page.screenshot(path=str(out / f"offline_{html.stem.split('.')[0]}_{key}_{k:02d}.png"))
        slide = page.locator("section.present").last
        now = json.dumps(page.evaluate("() => Reveal.getIndices()"))
        extent = page.evaluate(SLIDE_EXTENT_JS)
        extent["step"] = k
        extents.setdefault(extent["slide"], []).append(extent)
        if now != last:                          # count what a slide shows once, not once per scroll step
            report["notes"] += slide.locator("aside.notes").count()
            report["math"] += slide.locator(".MathJax, .MathJax_Display, mjx-container").count()
            report["math_errors"] += slide.locator(".MathJax_Error, merror").count()
            report["plots"] += slide.locator(".js-plotly-plot .main-svg").count() and 1
            report["plots_undrawn"] += slide.locator(".plotly-graph-div:not(:has(.main-svg))").count()
            report["snapshots"] += slide.locator(".labsupport-panel-snapshot").count()
            report["text_widgets"] += slide.get_by_text(re.compile(r"^(VBox|HBox|FigureWidget)\(")).count()
        report["advanced"] += now != last
        last = now
        if page.evaluate("() => Reveal.isLastSlide() && !Reveal.availableFragments().next") and not page.evaluate(
                "() => { const s = Reveal.getCurrentSlide(); return s.classList.contains('ls-scroll') && "
                "s.scrollTop + s.clientHeight < s.scrollHeight - 2; }"):
            report["reached_end"] = True
            break
        page.keyboard.press(key)                  # linear navigation: slides and their subslides in order
        time.sleep(0.8)
    report["slides_seen"] = len(extents)
    report["cut"] = []
    for name, seen in extents.items():
        report["fitted"] += any(e["zoom"] != "1" for e in seen)
        report["scrolled"] += any(e["scrolls"] for e in seen)
        edges = {"top": any(e["box"]["top"] >= e["seen"]["top"] for e in seen),
                 "bottom": any(e["box"]["bottom"] <= e["seen"]["bottom"] for e in seen),
                 "left": all(e["box"]["left"] >= e["seen"]["left"] for e in seen),
                 "right": all(e["box"]["right"] <= e["seen"]["right"] for e in seen)}
        if not all(edges.values()):
            worst = max(seen, key=lambda e: e["box"]["bottom"] - e["seen"]["bottom"])
            report["cut"].append({"slide": name, "edges": [k for k, ok in edges.items() if not ok],
                                  "steps": [e["step"] for e in seen],
                                  "below_px": round(min(e["box"]["bottom"] - e["seen"]["bottom"] for e in seen)),
                                  "right_px": round(max(e["box"]["right"] - e["seen"]["right"] for e in seen)),
                                  "zoom": worst["zoom"]})
    report["remote_requests"] = [u for u in requests if not u.startswith(("file://", "data:", "about:"))]
    # Harmless and local: MathJax's HTML-CSS output tests for fonts with a @font-face at about:blank;
    # one generic "Failed to load resource" console line accompanies it. A missing local file is an error.
    probes = [e for e in errors if "about:blank" in e]
    report["console_errors"] = [e for e in errors if e not in probes and not (
        e.startswith("Failed to load resource: net::ERR_FAILED") and probes)][:10]
    context.close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", help="paths relative to the repo root, e.g. chapters/01_sampling.ipynb")
    parser.add_argument("--out", type=Path, default=Path("/tmp/browser_check"))
    parser.add_argument("--run-timeout", type=float, default=240.0)
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1600)
    parser.add_argument("--repeat", type=int, default=1,
                        help="Run All this many times (then Restart Kernel and Run All) before operating the controls")
    parser.add_argument("--deck", action="store_true", help="also present each notebook with jupyterlab-slideshow")
    parser.add_argument("--deck-only", action="store_true", help="with --deck: skip the per-panel checks before it")
    parser.add_argument("--deck-key", default=None, help="with --deck: also step the live deck with this key "
                        "alone (e.g. ArrowRight) and list the cells it never shows")
    parser.add_argument("--deck-size", default="1280x720", help="with --deck: the viewport of the deck (a projector)")
    parser.add_argument("--offline", action="store_true",
                        help="the arguments are exported .slides.html decks: open them from disk, offline")
    parser.add_argument("--offline-viewport", default="1280x800", metavar="WxH",
                        help="with --offline: the browser window, e.g. 1280x720 or 1920x1080 (a projector)")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    if args.offline:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
            size = tuple(int(v) for v in args.offline_viewport.lower().split("x"))
            reports = [check_offline(browser, Path(h), args.out, size, key) for h in args.notebooks
                       for key in ("Space", "ArrowRight")]
            browser.close()
        print(json.dumps({"offline_reports": reports}, indent=2))
        bad = any(r["remote_requests"] or r["console_errors"] or r["text_widgets"] or not r["reached_end"]
                  or r["cut"] or r["plots_undrawn"] or r["math_errors"] or r["slides_seen"] < r["slides"]
                  for r in reports)
        return 1 if bad else 0

    port = free_port()
    scratch = Path(tempfile.mkdtemp(prefix="browser_check_"))
    for nb in args.notebooks:
        rel = Path(os.path.relpath(Path(nb).resolve(), ROOT))
        (scratch / rel.parent).mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, scratch / rel)
    lab = start_lab(port, scratch)
    reports, console_errors = [], []
    ignored = ("favicon", "Failed to load resource", "net::ERR")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            console_all: list[str] = []
            page.on("console", lambda m: console_all.append(f"{m.type}: {m.text}"))
            for nb in args.notebooks:
                rel = os.path.relpath(Path(nb).resolve(), ROOT)
                print(f"{rel}:", flush=True)
                seen = len(console_errors)
                reports.append(check_notebook(page, port, rel, args.out / Path(rel).stem, args.run_timeout,
                                              skip_panels=args.deck_only, repeat=args.repeat,
                                              log=lambda line: print(line, flush=True)))
                if args.deck:
                    size = tuple(int(v) for v in args.deck_size.lower().split("x"))
                    if args.deck_key:                     # first, as a presenter enters the deck after Run All
                        reports[-1].update(check_deck_keys(page, scratch / rel, args.deck_key, size=size,
                                                           out=args.out / Path(rel).stem))
                    reports[-1].update(check_deck(page, args.out / Path(rel).stem, size=size,
                                                 run_timeout=args.run_timeout))
                    reports[-1]["deck_failed"] = (deck_failed(reports[-1])
                                                  or bool(reports[-1].get("deck_key_cells_never_shown")))
                reports[-1]["console_errors"] = [e for e in console_errors[seen:] if not any(s in e for s in ignored)]
                (args.out / Path(rel).stem / "console.txt").write_text("\n".join(console_all))   # every type, for reading
                console_all.clear()
                reports[-1]["tabs_left"] = close_notebook(page, port, {"width": args.width, "height": args.height})
                print(json.dumps(reports[-1], indent=1, ensure_ascii=False), flush=True)   # each notebook as it is done
            browser.close()
    finally:
        os.killpg(lab.pid, 15)
        shutil.rmtree(scratch, ignore_errors=True)
    console_errors = [e for e in console_errors if not any(s in e for s in ignored)]
    summary = [{"notebook": r["notebook"], "run_all_seconds": r["run_all_seconds"], "controls": r["controls"],
                "tracebacks": len(r["tracebacks"]), "no_redraw": r["no_redraw"], "blank_figures": r["blank_figures"],
                "cut_labels": r.get("cut_labels", []), "console_errors": len(r["console_errors"]),
                "deck_failed": r.get("deck_failed")} for r in reports]
    print(json.dumps({"summary": summary, "console_errors": console_errors[:20]}, indent=1, ensure_ascii=False))
    bad = (any(r["tracebacks"] or not r["finished"] or r["no_redraw"] or r["blank_figures"] or r.get("deck_failed")
               or r.get("cut_labels") or r.get("tabs_left") for r in reports) or bool(console_errors))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
