# Two commands for a fresh machine:
#   make demo   set up .venv, pull the default model pair, run a speculative generation
#   make test   set up .venv with the test extras and run the whole suite (what CI runs)
#   make test-fast  everything not marked real or slow (a few minutes)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.augury-installed

.PHONY: demo test test-fast venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install --disable-pip-version-check -q torch==2.13.0
	$(BIN)/pip install --disable-pip-version-check -q -e '.[test]'
	# speculators (tests/test_export.py loads augury's export with its classes): --no-deps, which extras cannot
	# say, because it requires torchvision/torchaudio (another torch) and transformers<=5.19; then the modules
	# its import reads, torch named so that pip keeps ours. About 270 MB (pyarrow, pandas) and 30 s.
	$(BIN)/pip install --disable-pip-version-check -q --no-deps speculators==0.9.0
	$(BIN)/pip install --disable-pip-version-check -q torch==2.13.0 loguru pydantic-settings aiohttp \
		'datasets>=4.0.0,<=5.1.0' hs-connectors==0.9.0
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/augury demo

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not real and not slow" tests

clean:
	rm -rf $(VENV) .pytest_cache
