"""Open chapters in real JupyterLab in headless Chromium, run all cells, operate every control.

    python3 tests/browser_check.py chapters/01_sampling.ipynb [...] --out /tmp/shots [--repeat 2]

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
finish, a control that did not redraw, a blank figure, or a console error.

Slides:

``--deck``: after "Run All" the notebook is presented with jupyterlab-slideshow ("Toggle Deck");
the check steps through the deck (→) and, on every slide that shows a live panel, saves
``deck_NN.png``, moves the panel's first slider and saves ``deck_NN_slider.png`` (a panel that
does not redraw is reported).

``--offline build/slides/01_sampling.slides.html [...]``: no JupyterLab; each exported deck is
opened from disk in a browser context with networking disabled, stepped through slide by slide
(``offline_<stem>_NN.png``), and the report counts slides, typeset formulas, drawn plotly
charts and panel snapshots, and lists every request that was not a local file, every widget
shown as text (``VBox(...)``) and console errors. Exit code 1 when any of those is found or a
deck does not advance.

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
            if not sel.is_visible():
                continue
            options = sel.evaluate("s => Array.from(s.options).map(o => o.value)")
            current = sel.evaluate("s => s.value")
            others = [o for o in options if o != current]
            if not others:
                continue
            before = shot()
            sel.select_option(others[-1])
            after(kind, k, before, "")

    for k, group in enumerate(cell.query_selector_all(CONTROL_KINDS["toggle_buttons"])):
        if not group.is_visible():
            continue
        buttons = [b for b in group.query_selector_all("button") if b.is_visible()]
        for j, b in enumerate(buttons):
            if "mod-active" in (b.get_attribute("class") or ""):
                continue
            before = shot()
            b.click()
            after("toggle_buttons", k, before, f"_option_{j}")
        if buttons and "mod-active" not in (buttons[0].get_attribute("class") or ""):   # back to the first
            before = shot()
            buttons[0].click()
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
            shown = "⚠" in cell.inner_text()
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


def close_notebook(page, port: int) -> None:
    """Close the notebook's tab and shut its kernel down (the next notebook gets the CPU)."""
    with contextlib.suppress(Exception):
        page.click("li.lm-MenuBar-item:has-text('File')")
        page.click(".lm-Menu-item:has-text('Close and Shut Down Notebook')", timeout=5000)
        for _ in range(3):                          # "shut down?" then perhaps "save?": accept / discard
            time.sleep(1)
            dialog = page.locator(".jp-Dialog")
            if not dialog.count():
                break
            discard = dialog.locator("button:has-text('Discard'), button:has-text(\"Don't Save\")")
            (discard.first if discard.count() else dialog.locator(".jp-mod-accept").first).click(timeout=5000)
    with contextlib.suppress(Exception):            # whatever is still running
        sessions = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/sessions", timeout=10))
        for s in sessions:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/api/sessions/{s['id']}", method="DELETE")
            urllib.request.urlopen(req, timeout=30)


def check_notebook(page, port: int, nb: str, out: Path, run_timeout: float, skip_panels: bool = False,
                   repeat: int = 1, log=print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    report = {"notebook": nb, "tracebacks": [], "no_redraw": [], "controls": {}, "invalid_inputs": [],
              "run_all_seconds": [], "finished": True, "log_messages": 0, "blank_figures": []}
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


def check_deck(page, out: Path, max_slides: int = 150) -> dict:
    """Present the open notebook with jupyterlab-slideshow; on each slide with a panel move a slider.

    Starts at the title cell and advances with the deck's on-screen remote (next subslide or
    fragment, else next slide) until both are disabled (the end) or ``max_slides`` steps.
    """
    report = {"deck_steps": 0, "deck_panels": 0, "deck_no_redraw": [], "deck_text_widgets": 0}
    page.evaluate("() => document.querySelector('.jp-WindowedPanel-outer, .jp-Notebook').scrollTo(0, 0)")
    time.sleep(1)
    page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-InputPrompt, .jp-Cell-inputCollapser").first.click()
    page.keyboard.press("Escape")                   # the deck starts at the active cell: the title
    page.click("[data-command='deck:toggle']")
    time.sleep(3)
    seen: set[int] = set()
    cell_of = "e => Array.from(document.querySelectorAll('.jp-Cell')).indexOf(e.closest('.jp-Cell'))"
    for k in range(max_slides):
        page.evaluate("() => document.activeElement && document.activeElement.blur()")
        handles = [h for h in page.locator(".widget-slider .noUi-handle").all() if h.is_visible()]
        report["deck_text_widgets"] += sum(t.is_visible() for t in page.get_by_text("VBox(children=").all())
        cell = handles[0].evaluate(cell_of) if handles else None
        if handles and cell not in seen:
            seen.add(cell)
            report["deck_panels"] += 1
            before = page.screenshot(path=str(out / f"deck_{k:02d}.png"))
            start = handles[0].get_attribute("aria-valuenow")
            handles[0].focus()
            handles[0].press("End")
            if handles[0].get_attribute("aria-valuenow") == start:
                handles[0].press("Home")
            time.sleep(3)
            after = page.screenshot(path=str(out / f"deck_{k:02d}_slider.png"))
            if after == before:
                report["deck_no_redraw"].append(f"deck step {k} (cell {cell})")
            page.evaluate("() => document.activeElement && document.activeElement.blur()")
        report["deck_steps"] = k + 1
        page.screenshot(path=str(out / f"deck_step_{k:02d}.png"))
        for direction in ("down", "forward"):      # the on-screen remote: subslide/fragment first, then next slide
            button = page.locator(f".jp-deck-mod-direction-{direction}").first
            if "jp-mod-disabled" not in (button.get_attribute("class") or ""):
                button.click()
                break
        else:
            break                                   # both disabled: the last slide
        time.sleep(1.0)
    page.screenshot(path=str(out / "deck_last.png"))
    return report


def check_offline(browser, html: Path, out: Path) -> dict:
    """Open an exported deck from disk with networking disabled and step through every slide."""
    out.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 800}, offline=True)
    page = context.new_page()
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    page.goto(html.resolve().as_uri())
    time.sleep(4)
    total = page.evaluate("() => Reveal.getTotalSlides()")
    report = {"deck": str(html), "slides": total, "advanced": 0, "math": 0, "plots": 0, "snapshots": 0,
              "text_widgets": 0, "reached_end": False}
    last = None
    for k in range(3 * total + 10):              # fragments take steps too; stop after the last slide
        page.screenshot(path=str(out / f"offline_{html.stem.split('.')[0]}_{k:02d}.png"))
        slide = page.locator("section.present").last
        report["math"] += slide.locator(".MathJax, .MathJax_Display, mjx-container").count()
        report["plots"] += slide.locator(".js-plotly-plot .main-svg").count() and 1
        report["snapshots"] += slide.locator(".labsupport-panel-snapshot").count()
        report["text_widgets"] += slide.get_by_text(re.compile(r"^(VBox|HBox|FigureWidget)\(")).count()
        now = json.dumps(page.evaluate("() => Reveal.getIndices()"))
        report["advanced"] += now != last
        last, now = now, None
        if page.evaluate("() => Reveal.isLastSlide() && !Reveal.availableFragments().next"):
            report["reached_end"] = True
            break
        page.keyboard.press("Space")              # reveal.js "next": slides and their subslides in order
        time.sleep(0.8)
    report["remote_requests"] = [u for u in requests if not u.startswith(("file://", "data:", "about:"))]
    # Harmless and local: MathJax probes a web font at about:blank, and its AMS-symbols extension
    # asks once for a TeX font file jupyter-server-mathjax does not ship (STIX-Web draws the glyph).
    # One generic "Failed to load resource" console line accompanies each such request.
    probes = [e for e in errors if "about:blank" in e or "/mathjax/fonts/HTML-CSS/TeX/" in e]
    report["console_errors"] = [e for e in errors if e not in probes and not (
        e.startswith("Failed to load resource") and probes)][:10]
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
    parser.add_argument("--offline", action="store_true",
                        help="the arguments are exported .slides.html decks: open them from disk, offline")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    if args.offline:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
            reports = [check_offline(browser, Path(h), args.out) for h in args.notebooks]
            browser.close()
        print(json.dumps({"offline_reports": reports}, indent=2))
        bad = any(r["remote_requests"] or r["console_errors"] or r["text_widgets"] or not r["reached_end"]
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
                    reports[-1].update(check_deck(page, args.out / Path(rel).stem))
                reports[-1]["console_errors"] = [e for e in console_errors[seen:] if not any(s in e for s in ignored)]
                (args.out / Path(rel).stem / "console.txt").write_text("\n".join(console_all))   # every type, for reading
                console_all.clear()
                print(json.dumps(reports[-1], indent=1, ensure_ascii=False), flush=True)
                close_notebook(page, port)
            browser.close()
    finally:
        os.killpg(lab.pid, 15)
        shutil.rmtree(scratch, ignore_errors=True)
    console_errors = [e for e in console_errors if not any(s in e for s in ignored)]
    summary = [{"notebook": r["notebook"], "run_all_seconds": r["run_all_seconds"], "controls": r["controls"],
                "tracebacks": len(r["tracebacks"]), "no_redraw": r["no_redraw"], "blank_figures": r["blank_figures"],
                "console_errors": len(r["console_errors"])} for r in reports]
    print(json.dumps({"summary": summary, "console_errors": console_errors[:20]}, indent=1, ensure_ascii=False))
    bad = (any(r["tracebacks"] or not r["finished"] or r["no_redraw"] or r["blank_figures"] or r.get("deck_no_redraw")
               or r.get("deck_text_widgets") for r in reports) or bool(console_errors))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
