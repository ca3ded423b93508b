# autoplan: two set-up commands for a fresh machine (make demo, make test), plus make lab.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# JupyterLab from .venv saves widget state with the notebook, so a notebook reopened without its
# kernel draws the explorer from it (lab-settings/; docs/explorer.md, "Saved notebooks")
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.d/autoplan.json

.PHONY: demo test test-fast lab install lint bench clean

# uv installs the same packages as pip in less time (its parallel downloads and unpacking), with
# their bytecode compiled as pip compiles it (without it, every process that imports JAX compiles
# its modules again where PYTHONDONTWRITEBYTECODE is set); pip installs them where uv cannot
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip uv
	$(PY) -m uv pip install -q --compile-bytecode --python $(PY) -e ".[dev]" || \
		$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

$(LAB_SETTINGS): lab-settings/overrides.d/autoplan.json $(STAMP)
	mkdir -p $(dir $@)
	cp $< $@

install: $(STAMP) $(LAB_SETTINGS)

demo: $(STAMP)
	$(PY) -m autoplan.demo

# the suite on every core (pytest-xdist), each test module on one worker (its module fixtures
# made once), handed out in conftest.py's order (the longest first; xdist would otherwise order
# them by their number of tests); PYTEST_WORKERS=0 runs it in this process (a worker more than
# the cores was tried: no faster, more CPU; docs/testing.md)
PYTEST_WORKERS ?= auto
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: $(STAMP)
	$(PY) -m ruff check autoplan tests benchmarks
	$(PY) -m pytest -q $(XDIST)

# the inner loop: everything but the tests marked slow (conftest.py's SLOW_MODULES)
test-fast: $(STAMP)
	$(PY) -m ruff check autoplan tests benchmarks
	$(PY) -m pytest -q -m "not slow" $(XDIST)

lab: $(STAMP) $(LAB_SETTINGS)
	$(VENV)/bin/jupyter lab notebooks/

lint: $(STAMP)
	$(PY) -m ruff check autoplan tests benchmarks

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache artifacts
