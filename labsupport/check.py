"""Environment check: ``python -m labsupport.check``.

Prints the versions that matter, the device the chapters will use, whether the shipped
models load and generate, and whether JupyterLab has the widget and plotly front-ends.
Exits with 1 when something a chapter needs is missing, so ``make test`` stops early with a
readable message instead of a failure deep inside a notebook. ``--device cuda`` instead runs the
core's invariants on that device (:mod:`labsupport.device_check`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import platform
import subprocess
import sys
from pathlib import Path

PACKAGES = ["torch", "transformers", "tokenizers", "safetensors", "numpy", "ipywidgets",
            "jupyterlab_widgets", "jupyterlab", "plotly", "anywidget", "tqdm", "nbstripout"]


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def lab_extensions() -> dict[str, bool]:
    """Which JupyterLab front-end extensions are installed (widgets manager, plotly renderer, live slides)."""
    found: dict[str, bool] = {"@jupyter-widgets/jupyterlab-manager": False, "jupyterlab-plotly": False,
                              "anywidget": False, "jupyterlab-slideshow": False}
    try:
        out = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"],
                             capture_output=True, text=True, timeout=60, check=False)
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    if not text:
        return found
    lines = [line for line in text.splitlines() if "enabled" in line and "OK" in line]
    for name in found:
        found[name] = any(f" {name} v" in line for line in lines)
    if not found["jupyterlab-plotly"]:  # plotly ≥ 6 renders through its own mime extension or anywidget
        found["jupyterlab-plotly"] = _version("plotly") is not None and int(_version("plotly").split(".")[0]) >= 6
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--no-model", action="store_true", help="skip loading the shipped models")
    parser.add_argument("--device", help="instead, check the core's invariants on this device ('cuda', 'cpu', "
                        "'mps'): engine logits = HF, greedy, swap, speculative (see labsupport.device_check)")
    args = parser.parse_args(argv)
    if args.device is not None:
        from .device_check import device_report

        return device_report(args.device)

    problems: list[str] = []
    report: dict = {"python": sys.version.split()[0], "platform": platform.platform(),
                    "interpreter": sys.executable, "packages": {p: _version(p) for p in PACKAGES}}
    venv = Path(__file__).resolve().parent.parent / ".venv"
    if venv.is_dir() and Path(sys.prefix).resolve() != venv.resolve():
        problems.append(f"this is {sys.executable}, not the course's environment: run "
                        f"`.venv/bin/python -m labsupport.check` (and `make lab`, which uses .venv)")
    for name, ver in report["packages"].items():
        if ver is None:
            problems.append(f"package {name} is not installed (run `make lab`, or `.venv/bin/python -m labsupport.check` "
                            "if you ran this with another Python)")

    import torch

    from .models import SHIPPED, load_model, pick_device

    device = pick_device("auto")
    report["device"] = str(device)
    report["torch_threads"] = torch.get_num_threads()
    report["cuda"] = torch.cuda.is_available()
    from .engine.native_attention import unavailable_reason

    why = unavailable_reason()                     # not a problem: the engine then gathers (TORCH_SDPA)
    report["attention_backend"] = "CPU_ATTN" if why is None else f"TORCH_SDPA (CPU_ATTN unavailable: {why})"
    from .engine.linear import cache_path, machine_key

    report["matrix_kernels"] = (f"timed once per machine and matrix shape, then read from {cache_path()} "
                                f"(machine: {machine_key()}), so every process computes alike")
    report["models"] = {}
    if not args.no_model:
        for name in SHIPPED:
            try:
                lm = load_model(name, device="cpu")
                ids = lm.encode("Return the")
                with torch.no_grad():
                    logits = lm.model(torch.tensor([ids])).logits
                ok = bool(torch.isfinite(logits).all())
                report["models"][name] = {
                    "parameters": sum(p.numel() for p in lm.model.parameters()),
                    "vocab_size": lm.model.config.vocab_size, "finite_logits": ok}
                if not ok:
                    problems.append(f"model {name} produced non-finite logits")
            except Exception as err:  # noqa: BLE001 - reported to the user below
                report["models"][name] = {"error": f"{err.__class__.__name__}: {err}"}
                problems.append(f"model {name} does not load: {err}")
    for mod in ("ipywidgets", "plotly.graph_objects", "anywidget"):
        try:
            importlib.import_module(mod)
        except Exception as err:  # noqa: BLE001
            problems.append(f"cannot import {mod}: {err}")
    try:  # go.FigureWidget needs anywidget with plotly >= 6
        import plotly.graph_objects as go

        go.FigureWidget()
        report["figure_widget"] = True
    except Exception as err:  # noqa: BLE001
        report["figure_widget"] = False
        problems.append(f"plotly FigureWidget unavailable ({err}); install anywidget")
    report["lab_extensions"] = lab_extensions()
    if not report["lab_extensions"]["@jupyter-widgets/jupyterlab-manager"]:
        problems.append("JupyterLab widget manager (jupyterlab_widgets) not found: sliders will not show")
    report["chapters"] = sorted(p.name for p in (Path(__file__).resolve().parent.parent / "chapters").glob("*.ipynb"))

    if args.json:
        print(json.dumps({**report, "problems": problems}, indent=2))
    else:
        print(f"Python {report['python']} on {report['platform']}")
        for name, ver in report["packages"].items():
            print(f"  {name:<20} {ver or 'MISSING'}")
        print(f"device: {report['device']} (torch threads: {report['torch_threads']})")
        print(f"engine attention on the CPU: {report['attention_backend']}")
        for name, info in report["models"].items():
            if "error" in info:
                print(f"model {name}: ERROR {info['error']}")
            else:
                print(f"model {name}: {info['parameters'] / 1e6:.2f} M parameters, vocab {info['vocab_size']}, loads OK")
        print("JupyterLab front-ends: " + ", ".join(f"{k} {'yes' if v else 'NO'}"
                                                for k, v in report["lab_extensions"].items()))
        print(f"plotly FigureWidget: {'yes' if report['figure_widget'] else 'NO'}")
        print(f"chapters: {len(report['chapters'])}")
        print("all good" if not problems else "PROBLEMS:\n  - " + "\n  - ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
