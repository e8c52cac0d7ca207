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
	$(PY) -m trainer.demo

test: install-test lint test-unit test-db test-system test-browser

lint: install-test
	$(VENV)/bin/ruff check .

# Unit tier: pure modules and the in-process cluster, no services.
test-unit: install-test
	$(VENV)/bin/pytest tests/test_compose.py tests/trainer tests/syncd tests/bench -m "not integration" -q -p no:cacheprovider

# Database tier, once per database in TEST_DATABASES: the web app, syncd against a
# Redis of the tests' own, and the runtime with real worker, syncd and island processes.
test-db: install-test
	mkdir -p var
	@for url in $(TEST_DATABASES); do \
		echo "== database tests on $$url"; \
		DATABASE_URL=$$url $(VENV)/bin/pytest tests/webapp -m "not system" -q \
			-p no:cacheprovider || exit 1; \
		DATABASE_URL=$$url $(VENV)/bin/pytest tests/trainer tests/syncd -m integration \
			-q -p no:cacheprovider || exit 1; \
	done

# System tier, once: whole systems with a database and Redis of their own: the chaos
# soak's CI tier (every kind of fault at least once, then every invariant) and a kill -9
# of every process of `python -m webapp.start` followed by a start again.
test-system: install-test
	mkdir -p var
	DATABASE_URL=sqlite:///var/test.sqlite3 $(VENV)/bin/pytest tests/bench tests/webapp \
		-m system -q -p no:cacheprovider

# Browser tier: a real Chromium (Debian's package) driven by Playwright.
test-browser: install-test
	mkdir -p var
	$(VENV)/bin/pytest tests/browser -q -p no:cacheprovider

bench-quality: install
	$(PY) -m bench quality

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
