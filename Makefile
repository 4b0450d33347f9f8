# Two commands for students:  make lab   (set up + open JupyterLab)   and   make test.
# torch is installed first, pinned, so pip never pulls a multi-GB CUDA build by itself.
# Override on a machine with a GPU, e.g.:  make lab TORCH_SPEC="torch"
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.labsupport-installed
NBVAL_ARGS  := --nbval-lax --nbval-current-env --sanitize-with tests/nbval_sanitize.cfg

.PHONY: setup lab test unit nbval slides check bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,slides]"
	touch $(STAMP)

setup: $(STAMP)

lab: setup
	$(VENV)/bin/jupyter lab chapters/

check: setup
	$(PY) -m labsupport.check

unit: setup              # the fast lane: everything but the tests marked slow
	$(PY) -m pytest -q -m "not slow" tests

nbval: setup
	$(PY) -m pytest -q $(NBVAL_ARGS) chapters/

test: setup
	$(PY) -m labsupport.check
	$(PY) -m pytest -q tests $(NBVAL_ARGS) chapters/

slides: setup
	mkdir -p build/slides
	PLOTLY_RENDERER="plotly_mimetype+notebook" $(VENV)/bin/jupyter nbconvert --to slides --execute \
		--output-dir build/slides chapters/*.ipynb

bench: setup
	$(PY) -m labsupport.bench all

clean:
	rm -rf build .pytest_cache .hypothesis
