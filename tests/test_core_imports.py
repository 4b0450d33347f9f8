"""The core runs without the notebook stack: on a GPU server (or in vLLM's venv) there may be no
ipywidgets, plotly or anywidget. A fresh interpreter with those imports blocked (a
``sys.meta_path`` hook) imports every module outside ``viz`` and ``widgets`` and generates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import importlib, pkgutil, sys

BLOCKED = {"ipywidgets", "plotly", "anywidget", "jupyterlab_widgets", "IPython"}

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: the core must not import it")
        return None

sys.meta_path.insert(0, Block())
import labsupport

skip = ("labsupport.viz", "labsupport.widgets")
names = [m.name for m in pkgutil.walk_packages(labsupport.__path__, "labsupport.")
         if not m.name.startswith(skip) and not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)

from labsupport.engine import LLMEngine
from labsupport.generation import generate
from labsupport.models import load_model
from labsupport.sampling import GREEDY

lm = load_model("tiny-gpt2", device="cpu")
ref = generate(lm, "Return the", GREEDY.replace(ignore_eos=True), max_new_tokens=6).token_ids
out = LLMEngine(lm, block_size=4, num_blocks=16).generate(["Return the"], GREEDY.replace(ignore_eos=True), 6)
assert out[0].token_ids == ref, (out[0].token_ids, ref)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
print(len(names), "modules")
"""


def test_core_imports_and_generates_without_widgets_or_plotly():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count = int(proc.stdout.split()[-2])
    assert count >= 15                         # sampling, generation, beam, kv, engine.*, speculative, sim.*, …
