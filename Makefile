# gpumarket — the two commands a user needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP_RUN  := $(VENV)/.installed-run
STAMP_TEST := $(VENV)/.installed-test
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/gpumarket
TEST_REDIS_URL    ?= redis://127.0.0.1:6379/0

.PHONY: demo test test-pgbouncer lint venv clean bench

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e .
	touch $@

$(STAMP_TEST): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@ $(STAMP_RUN)

venv: $(STAMP_RUN)

## make demo: migrate the SQLite default, play the recorded-hosts scenario, serve on :8000
demo: $(STAMP_RUN)
	$(PY) -m marketplace.demo

## make test: ruff, then pytest against PostgreSQL and Redis on 127.0.0.1 (and Docker)
test: $(STAMP_TEST)
	$(VENV)/bin/ruff check .
	@# each run's metrics files (core/metrics.py, multi-process mode) in a folder of its own
	metrics=$$(mktemp -d /tmp/gpumarket-metrics-XXXXXX); \
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
		PROMETHEUS_MULTIPROC_DIR=$${PROMETHEUS_MULTIPROC_DIR:-$$metrics} \
		$(VENV)/bin/pytest $(PYTEST_ARGS); status=$$?; rm -rf "$$metrics"; exit $$status

## make test-pgbouncer: the e2e lease flow and the concurrency tests again, every
## connection through a PgBouncer in transaction mode (tests/support/pgbouncer.py)
PGBOUNCER_TESTS ?= tests/e2e/test_lease_flow.py tests/marketplace/test_book_concurrency.py \
	tests/marketplace/test_locking.py tests/marketplace/api/test_bid_batcher.py
test-pgbouncer: $(STAMP_TEST)
	metrics=$$(mktemp -d /tmp/gpumarket-metrics-XXXXXX); \
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
		PROMETHEUS_MULTIPROC_DIR=$${PROMETHEUS_MULTIPROC_DIR:-$$metrics} GPUMARKET_TEST_PGBOUNCER=1 \
		$(VENV)/bin/pytest $(PGBOUNCER_TESTS); status=$$?; rm -rf "$$metrics"; exit $$status

lint: $(STAMP_TEST)
	$(VENV)/bin/ruff check .

bench: $(STAMP_TEST)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) bench/orderbook.py
	$(PY) bench/sealed.py

clean:
	rm -rf var/ .pytest_cache

# --- contracts (on-chain settlement; see contracts/README.md) -------------------------
# `make contracts` installs the pinned npm toolchain (solc, OpenZeppelin, Hardhat 2) and
# rebuilds the committed artifacts in contracts/build/. `make test` installs the toolchain
# first when npm is present, so the chain tests (recompile check, Hardhat node) can run.
CONTRACTS_NODE_MODULES := contracts/node_modules/.package-lock.json
CONTRACTS_TEST_DEPS    := $(if $(shell command -v npm 2>/dev/null),$(CONTRACTS_NODE_MODULES))

.PHONY: contracts
$(CONTRACTS_NODE_MODULES): contracts/package.json contracts/package-lock.json
	npm ci --prefix contracts --no-audit --no-fund
	touch $@

contracts: $(CONTRACTS_NODE_MODULES)
	npm run --prefix contracts build

test: $(CONTRACTS_TEST_DEPS)
