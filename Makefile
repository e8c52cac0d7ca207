# Archipelago: `make start` installs and starts everything; `make test` installs and tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Database URLs the database tests run against, one pass each.
TEST_DATABASES ?= sqlite:///var/test.sqlite3 postgres://postgres@127.0.0.1:5432/archipelago

.PHONY: install install-test start demo test test-unit test-db test-system test-browser lint \
	bench-quality clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

# The whole system on embedded defaults (SQLite and Redis under var/, nothing to set
# up): web app, syncd, a Celery worker per region, the demo run. Ctrl-C stops it all
# within 10 s.
start: install
	$(PY) -m webapp.start

# The demo run's method alone, in one process, with no services.
demo: install
	$(PY) -m diloco.demo

test: install-test lint test-unit test-db test-system test-browser

# ruff, the layers (docs/ARCHITECTURE.md, "Layers"; contracts in pyproject.toml), the
# house's size limits and its vocabulary (the glossary's banned synonyms, paths that exist).
lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest tests/test_sizes.py tests/test_vocabulary.py -q -p no:cacheprovider

# Unit tier: pure modules and the in-process cluster, no services; and the test
# tiers' own tools (the databases of test-db, the Chromium of test-browser).
test-unit: install-test
	$(VENV)/bin/pytest tests/test_compose.py tests/test_databases.py tests/diloco tests/trainer tests/syncd \
		tests/bench -m "not integration" -q -p no:cacheprovider

# Database tier, once per database in TEST_DATABASES: the web app and the scenarios
# across it (tests/system: its doors, its hosts) and syncd against a Redis of the tests'
# own; then the runtime with real worker, syncd and island processes (marked
# `processes`) once, on the last database of TEST_DATABASES (PostgreSQL by default): the
# processes are what it tests, and a second pass doubled the tier's time.
# tests/databases.py makes sure each database answers: a local PostgreSQL where
# nothing listens is replaced by a throwaway one under var/, stopped afterwards.
test-db: install-test
	mkdir -p var
	$(PY) -m tests.databases $(TEST_DATABASES) -- sh -c '\
		$(VENV)/bin/pytest tests/webapp tests/system -m "not system and not processes" -q -p no:cacheprovider && \
		$(VENV)/bin/pytest tests/trainer tests/syncd -m integration -q -p no:cacheprovider'
	$(PY) -m tests.databases $(lastword $(TEST_DATABASES)) -- \
		$(VENV)/bin/pytest tests/webapp -m processes -q -p no:cacheprovider

# System tier, once: whole systems with a database and Redis of their own: the chaos
# soak's CI tier (every kind of fault at least once, then every invariant), a kill -9
# of every process of `python -m webapp.start` followed by a start again, and the quick
# profile of `bench efficiency`, written to bench/results/efficiency-quick.json as a
# measurement (its targets reported, not asserted).
test-system: install-test
	mkdir -p var
	DATABASE_URL=sqlite:///var/test.sqlite3 $(VENV)/bin/pytest tests/bench tests/system \
		-m system -q -p no:cacheprovider

# Browser tier: a real Chromium driven by Playwright. bench/browser.py finds it, or
# installs Debian's package chromium as root on Debian or Ubuntu, or says what to install.
test-browser: install-test
	mkdir -p var
	$(PY) -m bench.browser
	$(VENV)/bin/pytest tests/browser -q -p no:cacheprovider

bench-quality: install
	$(PY) -m bench quality

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
