# Every target sets up the virtual environments it needs on first use; later runs
# only re-install when pyproject.toml (or this Makefile) changed.
#
#   .venv              jax==jaxlib==0.6.0, the project and its test extra: the main
#                      suite, and every bit-exact comparison with legacy jax.pmap.
#   .venv-jax0.10.2    jax==jaxlib==0.10.2 (newest release served): converted code,
#                      recordings checked across versions, the guide's 0.10.2 blocks.
#   .venv-jaxX.Y.Z     every other release pip serves for Python 3.11 from 0.4.35 on
#                      (EXTRA_JAX): `make test` smokes each (tests/test_release_smoke.py),
#                      `make test-all` runs the default suites on each where the packages
#                      import (SUITE_JAX); 0.4.38 and 0.7.2 also run the recording CLI.
#
# .venv gets exactly the versions in .ci/constraints-jax0.6.0.txt; the extra
# environments get the project with --no-deps and only what the code run there imports
# (pytest-xdist too: `make test` runs the applicable suites in .venv-jax0.10.2 directly).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JOBS ?= 2
NEWEST_JAX := 0.10.2
NEWEST_PY := .venv-jax$(NEWEST_JAX)/bin/python
EXTRA_JAX := $(NEWEST_JAX) 0.4.35 0.4.38 0.5.3 0.6.2 0.7.0 0.7.2 0.8.0 0.8.2 0.9.0 0.9.2 0.10.0
# The releases besides 0.6.0 and the newest where both packages import (older ones stop at
# import with a message naming the nearest release they run on, which the smoke checks).
SUITE_JAX := 0.6.2 0.7.0 0.7.2 0.8.0 0.8.2 0.9.0 0.9.2 0.10.0
RELEASE_SUITES := tests/shard_map_impl tests/pmap_compat
EXTRA_STAMPS := $(foreach v,$(EXTRA_JAX),.venv-jax$(v)/.installed)
# What runs in-process on jax 0.10.2 (tests marked jax06_only skip themselves there);
# the rest of the suite is about jax 0.6.0 or starts its own interpreters.
NEWEST_SUITES := tests/shard_map_impl tests/pmap_compat tests/test_harness.py tests/test_structure.py
PYTEST := -m pytest -n $(JOBS) --dist loadgroup

.PHONY: setup venvs demo docs lint test test-all test-jax0.6.0 test-jax$(NEWEST_JAX) \
	test-all-jax0.6.0 test-all-jax$(NEWEST_JAX) record-legacy bench clean \
	test-conformance test-all-conformance

setup: $(STAMP)

# The environments are independent: build up to VENV_JOBS at once (pip mostly waits on
# downloads and unpacking), whatever -j the caller gave.
VENV_JOBS ?= 4
venvs:
	@$(MAKE) --no-print-directory -j$(VENV_JOBS) $(STAMP) $(EXTRA_STAMPS)

$(STAMP): pyproject.toml .ci/constraints-jax0.6.0.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c .ci/constraints-jax0.6.0.txt -e '.[test]'
	@touch $(STAMP)

.venv-jax%/.installed: pyproject.toml Makefile
	@test -x .venv-jax$*/bin/python || $(PYTHON) -m venv .venv-jax$*
	.venv-jax$*/bin/python -m pip install --quiet --upgrade pip
	.venv-jax$*/bin/python -m pip install --quiet 'jax==$*' 'jaxlib==$*' pytest \
	  'pytest-xdist>=3.3' libcst absl-py 'ruff>=0.4'
	.venv-jax$*/bin/python -m pip install --quiet --no-deps -e .
	@touch $@

# Real third-party programs (tests/real_programs: numpyro, brax, a Flax example), one
# environment per JAX line with every package pinned in .ci/real-programs-jax<line>.txt; a
# library with no release for that line is listed there as `# skip NAME: reason` and printed.
# `make test` needs the 0.6.0 one (its numpyro case), `make test-all` both.
REAL_STAMPS := .venv-real-jax0.6.0/.installed .venv-real-jax$(NEWEST_JAX)/.installed
.venv-real-jax%/.installed: .ci/real-programs-jax%.txt pyproject.toml
	@test -x .venv-real-jax$*/bin/python || $(PYTHON) -m venv .venv-real-jax$*
	.venv-real-jax$*/bin/python -m pip install --quiet --upgrade pip
	.venv-real-jax$*/bin/python -m pip install --quiet -r .ci/real-programs-jax$*.txt
	.venv-real-jax$*/bin/python -m pip install --quiet --no-deps -e .
	@sed -n 's/^# skip /skipped on jax $*: /p' .ci/real-programs-jax$*.txt
	@touch $@

# Only the two environments tools/demo.py runs in (jax 0.6.0 and the newest).
demo: $(STAMP) .venv-jax$(NEWEST_JAX)/.installed
	$(PY) tools/demo.py

# The documentation site (docs/, Sphinx + MyST) into docs/_build/html; warnings are errors
# and internal links are checked (tests/test_docs.py builds it the same way).
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html

# ruff and mypy, configured in pyproject.toml; any failing fails the build. mypy runs once
# per JAX line, against that line's JAX, taking the adapters' line constants as fixed
# (--always-true/false), so each run checks that line's branches only; fastpath.py runs
# on jax 0.6 only. Each run keeps its own cache (the options differ).
LINT_PATHS := shard_map_impl pmap_compat codemod tools bench examples tests
MYPY_JAX06 := --cache-dir .mypy_cache/jax0.6.0 \
  --always-true LEGACY_PMAP_RUNTIME
MYPY_NEWEST := --cache-dir .mypy_cache/jax$(NEWEST_JAX) --python-executable $(NEWEST_PY) \
  --always-false LEGACY_PMAP_RUNTIME --exclude '^pmap_compat/fastpath\.py$$'
lint: $(STAMP) .venv-jax$(NEWEST_JAX)/.installed
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/mypy $(MYPY_JAX06)
	$(VENV)/bin/mypy $(MYPY_NEWEST)

# Lint, the whole suite on jax 0.6.0 (tests that need an older JAX run their code in that
# environment's python, tests/support/venvs.py), then the applicable suites in-process on
# jax 0.10.2, where legacy jax.pmap's results come from tests/data/legacy. `make -k test`
# runs both lines even when the first fails.
test: lint test-jax0.6.0 test-jax$(NEWEST_JAX) test-conformance

test-jax0.6.0: venvs .venv-real-jax0.6.0/.installed
	$(PY) $(PYTEST) -m "not slow" $(PYTEST_ARGS)

test-jax$(NEWEST_JAX): venvs
	$(NEWEST_PY) $(PYTEST) -m "not slow" $(NEWEST_SUITES) $(PYTEST_ARGS)

test-all: test-all-jax0.6.0 test-all-jax$(NEWEST_JAX) $(foreach v,$(SUITE_JAX),test-suites-jax$(v)) \
	test-all-conformance

test-all-jax0.6.0: venvs $(REAL_STAMPS)
	$(PY) $(PYTEST) $(PYTEST_ARGS)

test-all-jax$(NEWEST_JAX): venvs
	$(NEWEST_PY) $(PYTEST) $(NEWEST_SUITES) $(PYTEST_ARGS)

# The default suites in-process on one other release (`make test-suites-jax0.8.2`).
test-suites-jax%: .venv-jax%/.installed
	.venv-jax$*/bin/python $(PYTEST) $(RELEASE_SUITES) $(PYTEST_ARGS)

# The conformance tier (tests/conformance): JAX's own shard_map_test.py and pmap_test.py of
# a release, run with JAX's implementation and again with ours substituted, outcomes
# compared (strict known-failure list). `make test`: 0.6.0 and the newest; `make test-all`:
# every release from 0.6.0 (SUITE_JAX too); `make test-conformance-jax0.8.2`: one release.
# Each case runs its two suites with -n 2 itself, so the cases go one at a time.
CONFORMANCE := -m pytest -p no:xdist -rA tests/conformance/check_jax_suites.py
test-conformance: $(STAMP) .venv-jax$(NEWEST_JAX)/.installed
	$(PY) $(CONFORMANCE) -m "not slow" $(PYTEST_ARGS)

test-all-conformance: venvs
	$(PY) $(CONFORMANCE) $(PYTEST_ARGS)

test-conformance-jax%: venvs
	$(PY) $(CONFORMANCE) -k "jax$*-" $(PYTEST_ARGS)

# Records legacy jax.pmap's result of every compare_with_legacy call into tests/data/legacy
# (replacing all recordings, so those of removed tests go), running the tests that make
# them on jax 0.6.0. One test's: RECORD_LEGACY=1 .venv/bin/python -m pytest NODE_ID.
record-legacy: $(STAMP)
	rm -rf tests/data/legacy
	RECORD_LEGACY=1 $(PY) $(PYTEST) tests/pmap_compat tests/test_harness.py $(PYTEST_ARGS)

# Every benchmark on jax 0.6.0; the two that compare with JAX's pmap/shard_map on 0.10.2 too.
bench: $(STAMP) .venv-jax$(NEWEST_JAX)/.installed
	@set -e; for b in bench/*.py; do echo "== $$b (jax 0.6.0)"; $(PY) $$b; done; \
	for b in bench/pmap_dispatch.py bench/shard_map_compile.py; do \
	  echo "== $$b (jax $(NEWEST_JAX))"; $(NEWEST_PY) $$b; done

clean:
	rm -rf $(VENV) .venv-jax* .venv-real-jax* .pytest_cache *.egg-info docs/_build
