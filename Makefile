# Fresh machine: `make test` or `make demo`. Both create .venv first (idempotent, fast when done).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup test demo bench clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q

demo: setup
	$(PY) -m lit_ppo fit algo=grpo

bench: setup
	$(PY) scripts/bench_algos.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
