# Every target sets up the virtual environments it needs on first use; later runs
# only re-install when pyproject.toml (or this Makefile) changed.
#
#   .venv              jax==jaxlib==0.6.0, the project and its test extra: the main
#                      suite, and every bit-exact comparison with legacy jax.pmap.
#   .venv-jax0.10.2    jax==jaxlib==0.10.2 (newest release served): converted code,
#                      recordings checked across versions, the guide's 0.10.2 blocks.
#   .venv-jax0.4.38,   older JAX lines a team may still run today; used to show that
#   .venv-jax0.7.2     `python -m pmap_compat.testing record` works there.
#
# The extra environments get the project with --no-deps (its own pins are for .venv)
# and only what the code run there imports.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JOBS ?= 2
EXTRA_JAX := 0.10.2 0.7.2 0.4.38
EXTRA_STAMPS := $(foreach v,$(EXTRA_JAX),.venv-jax$(v)/.installed)

.PHONY: setup venvs demo lint test test-all bench clean

setup: $(STAMP)

venvs: $(STAMP) $(EXTRA_STAMPS)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

.venv-jax%/.installed: pyproject.toml Makefile
	@test -x .venv-jax$*/bin/python || $(PYTHON) -m venv .venv-jax$*
	.venv-jax$*/bin/python -m pip install --quiet --upgrade pip
	.venv-jax$*/bin/python -m pip install --quiet 'jax==$*' 'jaxlib==$*' pytest libcst absl-py
	.venv-jax$*/bin/python -m pip install --quiet --no-deps -e .
	@touch $@

demo: venvs
	$(PY) tools/demo.py

# ruff and mypy, configured in pyproject.toml; either failing fails the build.
LINT_PATHS := shard_map_impl pmap_compat codemod tools bench examples tests
lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/mypy

# Lint, then one pytest run on jax 0.6.0; tests that need another JAX run their code in
# that environment's python (tests/support/venvs.py).
test: lint venvs
	$(PY) -m pytest -n $(JOBS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

test-all: venvs
	$(PY) -m pytest -n $(JOBS) --dist loadgroup $(PYTEST_ARGS)

bench: $(STAMP)
	@set -e; for b in bench/*.py; do echo "== $$b"; $(PY) $$b; done

clean:
	rm -rf $(VENV) .venv-jax* .pytest_cache *.egg-info
