# One entry point for humans and CI. Every target creates .venv and installs
# what it needs on first use, so each works on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DEV    := $(VENV)/.installed-dev
CONFIG ?= config.example.toml

.PHONY: run test bench lint format clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(DEV): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

run: $(DEV)
	$(VENV)/bin/agentik run -c $(CONFIG)

test: $(DEV)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(DEV)
	$(PY) benchmarks/bench_core.py

lint: $(DEV)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(DEV)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
