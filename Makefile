# The two commands the README promises, plus the checks CI and contributors run.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench install screenshots

# The core install (SQLite, the library and the command) is all the demo uses; the suite
# and the benchmarks need every extra and the peers they measure against.
$(BIN)/ledgerq: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(BIN)/ledgerq

$(VENV)/.dev: $(BIN)/ledgerq
	$(BIN)/pip install -q -e '.[dev]'
	touch $(VENV)/.dev

install: $(VENV)/.dev

demo: $(BIN)/ledgerq
	$(BIN)/ledgerq demo

test: install
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	@# Bytecode for src/, whatever PYTHONDONTWRITEBYTECODE says: the suite starts ~670
	@# Python processes (~520 of them the CLI), and each would compile ledgerq anew.
	$(BIN)/python -m compileall -q src
	$(BIN)/pytest -q -n 2 -m "not serial"
	$(BIN)/pytest -q -m serial

bench: install
	$(BIN)/python bench/transition.py
	$(BIN)/python bench/queue.py
	$(BIN)/python bench/runtime.py
	$(BIN)/python bench/rebuild.py
	$(BIN)/python bench/postgres.py   # PostgreSQL on 127.0.0.1:5432 (scratch databases)
	$(BIN)/python bench/pg_cpu.py
	$(BIN)/python bench/pg_scaling.py
	$(BIN)/python bench/statements.py
	$(BIN)/python bench/statements.py --pg
	$(BIN)/python bench/archive.py
	$(BIN)/python bench/submit_cpu.py
	$(BIN)/python bench/concurrent_submit.py   # both backends
	$(BIN)/python bench/parts.py --without checks --without dependents
	$(BIN)/python bench/instructions.py   # needs valgrind (apt-get install valgrind)
	$(BIN)/python bench/footprint.py   # fresh venvs from the package index

# The dashboard screenshots the README shows (headless Chromium: apt-get install chromium).
screenshots: install
	LEDGERQ_SCREENSHOTS=docs/img LEDGERQ_REQUIRE_BROWSER=1 $(BIN)/pytest -q tests/web/test_http_dashboard.py
