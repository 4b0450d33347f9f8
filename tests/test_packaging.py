"""Packaging: environment.yml and pyproject.toml list the same dependencies; no exact pins."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"torch": "pytorch"}   # conda-forge names that differ from PyPI's


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject() -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(data["project"]["dependencies"])
    for extra in ("test", "slides"):
        reqs += data["project"]["optional-dependencies"][extra]
    return {_name(r): r for r in reqs}


def _conda() -> dict[str, str]:
    deps = {}
    text = (ROOT / "environment.yml").read_text()
    for line in text[text.index("dependencies:"):].splitlines():
        m = re.match(r"^\s{2}- ([A-Za-z0-9_.\-]+)(.*)$", line)
        if m and m.group(1) not in ("python", "pip"):
            deps[m.group(1).lower().replace("_", "-")] = m.group(1) + m.group(2)
    return deps


def test_environment_yml_matches_pyproject():
    py = {CONDA_NAMES.get(k, k): v for k, v in _pyproject().items()}
    conda = _conda()
    assert set(py) == set(conda), f"only in pyproject: {set(py) - set(conda)}; only in environment.yml: {set(conda) - set(py)}"
    for name, req in py.items():
        bound = re.search(r">=\s*([0-9.]+)", req)
        assert bound, f"{req}: give a lower bound"
        assert f">={bound.group(1)}" in conda[name], f"{name}: pyproject says {req}, environment.yml {conda[name]}"


def test_no_exact_pins_and_torch_is_installed_first():
    for req in _pyproject().values():
        assert "==" not in req, f"exact pin in pyproject: {req}"
    makefile = (ROOT / "Makefile").read_text()
    torch_line = makefile.index('pip install --quiet "$(TORCH_SPEC)"')
    package_line = makefile.index('pip install --quiet -e ".[test,slides]"')
    assert torch_line < package_line
    assert "TORCH_SPEC  ?= torch==2.13.0" in makefile


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme


def test_anywidget_importable_in_kernel_env():
    """plotly >= 6 FigureWidget needs anywidget; it is declared and importable here."""
    import anywidget  # noqa: F401
    import plotly.graph_objects as go

    assert "anywidget" in _pyproject()
    fig = go.FigureWidget(go.Bar(y=[1, 2]))
    fig.data[0].y = [3, 4]
    assert list(fig.data[0].y) == [3, 4]


def test_widget_frontend_pairing():
    """ipywidgets 8 is paired with jupyterlab_widgets 3 in the same environment."""
    from importlib.metadata import version

    assert version("ipywidgets").split(".")[0] == "8"
    assert version("jupyterlab_widgets").split(".")[0] == "3"


def _committed(path: Path) -> str:
    """A chapter as committed (``git show HEAD:...``): a student's saved outputs never fail this test.
    Outside git, or for a chapter not committed yet, the working file."""
    rel = path.relative_to(ROOT).as_posix()
    if shutil.which("git"):
        done = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{rel}"], check=False,
                              capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout
    return path.read_text(encoding="utf-8")


def _chapters() -> list[Path]:
    """Both editions' chapters (chapters/ and the Korean chapters-ko/)."""
    chapters = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")) + sorted((ROOT / "chapters-ko").glob("[0-9][0-9]_*.ipynb"))
    assert chapters, "no chapters found"
    return chapters


def test_chapters_have_kernelspec_python3_slides_and_no_stray_outputs():
    """C25 + house rules, on the committed chapters: plain python3 kernelspec, slide metadata on
    every cell, only NBVAL_CHECK_OUTPUT cells keep outputs, and a seed is set at the top."""
    import nbformat

    for path in _chapters():
        nb = nbformat.reads(_committed(path), as_version=4)
        assert nb.metadata["kernelspec"]["name"] == "python3", path.name
        for cell in nb.cells:
            assert "slideshow" in cell.metadata, f"{path.name}: a cell has no slide metadata"
            if cell.cell_type == "code" and "NBVAL_CHECK_OUTPUT" not in cell.source:
                assert not cell.outputs, f"{path.name}: committed outputs in a non-compared cell"
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        seeded = ("seed_everything(" in code or "manual_seed(" in code
                  or re.search(r"setup_chapter\([^)]*seed=\d", code))
        assert seeded, f"{path.name} is not seeded"


def test_committed_chapters_are_what_the_git_filter_commits():
    """Each committed chapter is a fixed point of the git filter ``make setup`` installs (nbstripout,
    with labsupport.nbfilter's numbering of the kept cells), so installing it leaves ``git status``
    clean; every NBVAL_CHECK_OUTPUT cell carries nbstripout's ``keep_output`` marker (its text
    survives the filter; nothing else does) and an execution count, so plain nbval compares it."""
    import nbformat

    from labsupport.nbfilter import clean

    sys.path.insert(0, str(ROOT / "tests"))
    from notebook_tools import is_marked

    for path in _chapters():
        text = _committed(path)
        nb = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.metadata.get("keep_output", False) == is_marked(cell), \
                    f"{path.name}: keep_output must be set exactly on NBVAL_CHECK_OUTPUT cells: {cell.source[:60]!r}"
            if cell.get("outputs"):                      # nbval: "Unrun reference cell has outputs" otherwise
                assert cell.get("execution_count") is not None, f"{path.name}: kept outputs need a count"
        stripped = clean(nbformat.reads(text, as_version=nbformat.NO_CONVERT))
        assert nbformat.writes(stripped) + "\n" == text, \
            f"{path.name}: not in committed form; run python tests/notebook_tools.py {path.relative_to(ROOT)}"


def test_setup_installs_the_output_filter_and_lab_runs_as_root():
    makefile = (ROOT / "Makefile").read_text()
    assert "nbstripout --install --attributes .gitattributes" in makefile
    assert "git config filter.nbstripout.clean" in makefile and "-m labsupport.nbfilter" in makefile
    assert re.search(r"^setup: .*git-filter", makefile, re.MULTILINE)
    attrs = (ROOT / ".gitattributes").read_text()
    assert "*.ipynb filter=nbstripout" in attrs and "*.ipynb diff=ipynb" in attrs
    assert "nbstripout" in _pyproject() and "nbstripout" in _conda()
    update = makefile[makefile.index("\nupdate:"):].split("\n\n")[0]   # git add -u refreshes git's view, then pull
    assert update.index("git add -u $(EDITIONS)") < update.index("git pull --ff-only")
    assert re.search(r"^EDITIONS +:= chapters/ chapters-ko/$", makefile, re.MULTILINE)
    assert '[ "$$(id -u)" = 0 ] && echo --allow-root' in makefile
    lab = re.search(r"^lab: .*\n\t(.*)$", makefile, re.MULTILINE).group(1)
    assert "$(ALLOW_ROOT)" in lab and "$(LAB_ARGS)" in lab
    # make test runs nbval on the chapters as committed (or saved), as nbval's users write it
    test_rule = makefile[makefile.index("\ntest:"):]
    assert "$(NBVAL_ARGS) $(EDITIONS)" in test_rule.split("\n\n")[0]
    lab_ko = re.search(r"^lab-ko: .*\n\t(.*)$", makefile, re.MULTILINE).group(1)
    assert lab_ko.endswith("chapters-ko/") and "$(ALLOW_ROOT)" in lab_ko
    slides = makefile[makefile.index("\nslides:"):].split("\n\n")[0]
    assert "chapters/*.ipynb --out build/slides\n" in slides and "chapters-ko/*.ipynb --out build/slides/ko" in slides


def _use_course_filter(repo: Path) -> None:
    """What ``make git-filter`` does after nbstripout's install: our clean step (labsupport.nbfilter)."""
    subprocess.run(["git", "-C", str(repo), "config", "filter.nbstripout.clean",
                    f"'{sys.executable}' -m labsupport.nbfilter"], check=True)


def _make_notebook(tmp: Path) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    marked = nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(6 * 7)")
    marked.metadata["keep_output"] = True
    marked.outputs = [nbformat.v4.new_output("stream", name="stdout", text="42\n")]
    student = nbformat.v4.new_code_cell("x = 1\nx")
    student.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "1", "text/html": "<b>1</b>"},
                                              execution_count=3)]
    student.execution_count = 3
    nb.cells = [marked, student]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    path = tmp / "chapters" / "99_demo.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return path


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_filter_keeps_student_outputs_out_of_commits(tmp_path):
    """The set-up's filter in a scratch repository: a notebook saved with outputs is committed
    without them, except the keep_output cell; the working file keeps its outputs."""
    repo = tmp_path
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.org", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([sys.executable, "-m", "nbstripout", "--install", "--attributes", ".gitattributes"],
                   cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "nbstripout", "--install", "--attributes", ".gitattributes"],
                   cwd=repo, check=True)                                   # idempotent
    _use_course_filter(repo)
    assert (repo / ".gitattributes").read_text().count("*.ipynb filter=nbstripout") == 1
    path = _make_notebook(repo)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "demo"], check=True)
    committed = json.loads(subprocess.run(git + ["show", "HEAD:chapters/99_demo.ipynb"], check=True,
                                          capture_output=True, text=True).stdout)
    marked, student = committed["cells"]
    assert marked["outputs"][0]["text"] == ["42\n"] or marked["outputs"][0]["text"] == "42\n"
    assert marked["execution_count"] == 1                                  # plain nbval compares it
    assert student["outputs"] == [] and student["execution_count"] is None
    assert "widgets" not in committed["metadata"]
    assert json.loads(path.read_text())["cells"][1]["outputs"], "the working file keeps the student's outputs"
    diff = subprocess.run(git + ["diff", "--stat"], check=True, capture_output=True, text=True).stdout
    assert diff == "", f"saved outputs show up as a change: {diff!r}"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_pull_goes_through_after_saving_outputs(tmp_path):
    """`make update`'s two steps: with outputs saved in a chapter, `git add -u` leaves nothing staged
    and `git pull --ff-only` brings in an upstream edit of that chapter."""
    up, student = tmp_path / "up", tmp_path / "student"
    git = ["-c", "user.email=t@example.org", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(up)], check=True)
    subprocess.run([sys.executable, "-m", "nbstripout", "--install", "--attributes", ".gitattributes"],
                   cwd=up, check=True)                                     # the course commits stripped chapters
    _use_course_filter(up)
    path = _make_notebook(up)
    subprocess.run(["git", "-C", str(up), *git, "add", "."], check=True)
    subprocess.run(["git", "-C", str(up), *git, "commit", "-qm", "start"], check=True)
    subprocess.run(["git", "clone", "-q", str(up), str(student)], check=True)
    subprocess.run([sys.executable, "-m", "nbstripout", "--install", "--attributes", ".gitattributes"],
                   cwd=student, check=True)
    _use_course_filter(student)
    import nbformat

    mine = student / "chapters" / "99_demo.ipynb"
    nb = nbformat.read(mine, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="saved by the student\n" * 50)]
    nb.cells[1].execution_count = 7
    nbformat.write(nb, mine)
    theirs = nbformat.read(path, as_version=4)
    theirs.cells.append(nbformat.v4.new_markdown_cell("upstream edit"))
    nbformat.write(theirs, path)
    subprocess.run(["git", "-C", str(up), *git, "commit", "-qam", "upstream"], check=True)
    subprocess.run(["git", "-C", str(student), *git, "add", "-u", "chapters/"], check=True)
    staged = subprocess.run(["git", "-C", str(student), "diff", "--cached", "--stat"], check=True,
                            capture_output=True, text=True).stdout
    assert staged == "", f"saved outputs were staged as a change: {staged!r}"
    done = subprocess.run(["git", "-C", str(student), *git, "pull", "-q", "--ff-only"], check=False,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "upstream edit" in mine.read_text()


def test_a_cell_run_before_the_setup_says_which_cell_to_run():
    """make setup writes the kernel config that installs labsupport.setup_hint: a NameError before the
    set-up names the set-up cell; after it (a typo) the traceback stays as it is."""
    from jupyter_client.manager import start_new_kernel

    makefile = (ROOT / "Makefile").read_text()
    assert "$(PY) -m labsupport.setup_hint $(VENV)/etc/ipython" in makefile
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        def run(code: str) -> str:
            msg_id, out = kc.execute(code), []
            while True:
                m = kc.get_iopub_msg(timeout=60)
                if m["parent_header"].get("msg_id") != msg_id:
                    continue
                if m["msg_type"] == "stream":
                    out.append(m["content"]["text"])
                if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                    return "".join(out)
        run("import labsupport.setup_hint as h; h.install()")          # what the kernel config runs
        assert "run the first code cell" in run("target.encode('x')")
        run("import labsupport.lab as lab; lab.SETUP_DONE = True")
        assert "run the first code cell" not in run("tarrget")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _figure_calls_dropped(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every figure builder (a call named ``…figure``) whose result a cell throws
    away: an expression statement that is not the cell's last top-level statement (Jupyter shows only
    that one), at any depth."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:                                   # IPython magics: not plain Python
        return []
    last = tree.body[-1] if tree.body else None
    dropped = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and node is not last and isinstance(node.value, ast.Call):
            func = node.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name.endswith("figure"):
                dropped.append((node.lineno, name))
    return dropped


def test_no_chapter_builds_a_figure_and_drops_it():
    """A figure built as a middle statement of a cell is never shown (the run prints on, the reader
    sees no figure): show it with display(...) or make it the cell's last line."""
    import nbformat

    assert _figure_calls_dropped("x = 1\nvp.bubble_figure(a)\nprint(x)") == [(2, "bubble_figure")]
    assert _figure_calls_dropped("x = 1\ndisplay(vp.bubble_figure(a))\nvp.bubble_figure(x)") == []
    assert _figure_calls_dropped("for k in ks:\n    timing_figure(k)\nprint(1)") == [(2, "timing_figure")]
    for path in _chapters():
        nb = nbformat.reads(_committed(path), as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                assert not _figure_calls_dropped(cell.source), f"{path.name} cell {i}: {_figure_calls_dropped(cell.source)}"


def test_chapters_import_from_package_faces_only():
    """Chapters import ``labsupport.X`` (a module or a subpackage's face), never a module inside a
    subpackage nor a private name: files can move inside a package without editing the chapters."""
    import ast
    import importlib

    import nbformat

    for path in _chapters():
        nb = nbformat.reads(_committed(path), as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            source = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labsupport"):
                    where = f"{path.parent.name}/{path.name} cell {i}: from {node.module} import …"
                    assert node.module.count(".") <= 1, where
                    assert not any(a.name.startswith("_") for a in node.names), where
                    face = importlib.import_module(node.module)
                    for a in node.names:
                        assert hasattr(face, a.name) or importlib.util.find_spec(f"{node.module}.{a.name}"), where
                if isinstance(node, ast.Import):
                    assert not any(a.name.startswith("labsupport.") and a.name.count(".") > 1 for a in node.names)


def test_no_module_of_the_package_runs_over_400_lines():
    """#50: a newcomer reads a module in one sitting; the large ones were split by concept (engine.py's request
    intake, the roofline out of kv.py, preemption by swap out of block_manager.py, speculative decoding's step
    costs out of bench/speculative.py)."""
    long = {p.relative_to(ROOT).as_posix(): n for p in sorted((ROOT / "labsupport").rglob("*.py"))
            for n in [len(p.read_text(encoding="utf-8").splitlines())] if n > 400}
    assert not long, long


def test_the_engine_package_docstring_maps_every_module():
    """#50: a newcomer opens labsupport/engine/__init__.py and finds every module named, in the order a request
    meets them; a new module must be added to the map."""
    import labsupport.engine as engine

    names = {p.stem if p.suffix == ".py" else p.name for p in (ROOT / "labsupport" / "engine").iterdir()
             if p.suffix in (".py", ".c") and p.stem != "__init__"}
    assert len(names) >= 20
    missing = sorted(n for n in names if f"``{n}``" not in engine.__doc__)
    assert not missing, missing


@pytest.mark.parametrize("stdin", [b"", b"[1, 2, 3]", b"{not json", b"\xff\xfe"])
def test_the_git_filter_says_no_notebook_in_one_line(stdin):
    done = subprocess.run([sys.executable, "-m", "labsupport.nbfilter"], input=stdin, capture_output=True, timeout=60,
                          check=False)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode().count("\n") == 1 and "no valid notebook on stdin" in done.stderr.decode()


def test_the_licences_are_stated_in_files_and_both_readmes():
    """#52: an instructor adopting the course needs to know what they may do: code MIT, text and figures CC BY 4.0."""
    assert "MIT License" in (ROOT / "LICENSE").read_text() and "Permission is hereby granted" in (ROOT / "LICENSE").read_text()
    content = (ROOT / "LICENSE-CONTENT.md").read_text()
    assert "CC BY 4.0" in content and "creativecommons.org/licenses/by/4.0" in content
    for readme in ("README.md", "README.ko.md"):
        text = (ROOT / readme).read_text()
        assert "LICENSE-CONTENT.md" in text and "CC BY 4.0" in text and "MIT" in text, readme
