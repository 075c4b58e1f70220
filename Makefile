# Set-up on a fresh machine needs only Python >= 3.10, pip and gcc: every target below builds
# its own virtualenv first. torch is pinned first so that nothing pulls a newer (CUDA) build.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
TORCH  ?= torch==2.13.0

.PHONY: install demo test test-fast clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[hf,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

test: $(STAMP)
	$(PY) -m pytest -q tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

clean:
	rm -rf $(VENV) .pytest_cache demo-out
