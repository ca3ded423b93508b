# autoplan: two set-up commands for a fresh machine (make demo, make test), plus make lab.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lab install lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m autoplan.demo

test: $(STAMP)
	$(PY) -m ruff check autoplan tests benchmarks
	$(PY) -m pytest -q

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

lint: $(STAMP)
	$(PY) -m ruff check autoplan tests benchmarks

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache artifacts
