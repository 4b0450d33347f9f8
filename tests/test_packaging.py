"""Packaging: environment.yml and pyproject.toml list the same dependencies; no exact pins."""

from __future__ import annotations

import re
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


def test_chapters_have_kernelspec_python3_slides_and_no_stray_outputs():
    """House rules: plain python3 kernelspec, slide metadata on every cell, only
    NBVAL_CHECK_OUTPUT cells keep outputs, and a seed is set at the top."""
    import nbformat

    chapters = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    assert chapters, "no chapters found"
    for path in chapters:
        nb = nbformat.read(path, as_version=4)
        assert nb.metadata["kernelspec"]["name"] == "python3", path.name
        for cell in nb.cells:
            assert "slideshow" in cell.metadata, f"{path.name}: a cell has no slide metadata"
            if cell.cell_type == "code" and "NBVAL_CHECK_OUTPUT" not in cell.source:
                assert not cell.outputs, f"{path.name}: committed outputs in a non-compared cell"
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        seeded = ("seed_everything(" in code or "manual_seed(" in code
                  or re.search(r"setup_chapter\([^)]*seed=\d", code))
        assert seeded, f"{path.name} is not seeded"
