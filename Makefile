# Every target sets up .venv on first use; later runs only re-install when
# pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JOBS ?= 2

.PHONY: setup demo test test-all bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) tools/demo.py

test: $(STAMP)
	$(PY) -m pytest -n $(JOBS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -n $(JOBS) --dist loadgroup $(PYTEST_ARGS)

bench: $(STAMP)
	@set -e; for b in bench/*.py; do echo "== $$b"; $(PY) $$b; done

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info
