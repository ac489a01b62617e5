# Two commands for a fresh machine:
#   make demo   set up .venv, pull the default model pair, run a speculative generation
#   make test   set up .venv with the test extras and run the whole suite (what CI runs)
#   make test-fast  everything not marked real or slow (a few minutes)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.augury-installed

.PHONY: demo test test-fast venv cross-tools clean

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

# tests/test_portable_cross.py builds the portable kernel for aarch64 and runs it under qemu-user: Debian's
# cross compiler and qemu (about 15 s to install) where this runs as root with apt-get; elsewhere that one test
# is skipped and says which tool is missing.
cross-tools:
	@if command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		export DEBIAN_FRONTEND=noninteractive; \
		pkgs="g++-aarch64-linux-gnu qemu-user"; \
		timeout 300 apt-get install -y -q --no-install-recommends $$pkgs >/dev/null 2>&1 || \
		{ timeout 300 apt-get update -q >/dev/null 2>&1 && \
		  timeout 300 apt-get install -y -q --no-install-recommends $$pkgs >/dev/null 2>&1; } || \
		echo "cross-tools: apt-get could not install $$pkgs; the aarch64 test will be skipped"; \
	else echo "cross-tools: not root or no apt-get; the aarch64 test will be skipped"; fi

# The tests on tiny models (most of the suite: single-threaded Python) run on two pytest-xdist workers
# (slow tests handed out first, an idle worker taking the tail of the other's queue); then the tests on
# real models, in one process with two threads each, so that the machine holds one of them at a time.
# The whole suite took 51.6 min against 74-79 in one process on a 2-core Zen 3 (README).
# TEST_WORKERS=0: no workers.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q --durations=20

test: $(STAMP) cross-tools
	$(PYTEST) -n $(TEST_WORKERS) --dist worksteal -m "not real" tests; tiny=$$?; \
	$(PYTEST) -m real tests; real=$$?; \
	test $$tiny = 0 && test $$real = 0

test-fast: $(STAMP)
	$(PYTEST) -n $(TEST_WORKERS) --dist worksteal -m "not real and not slow" tests

clean:
	rm -rf $(VENV) .pytest_cache
