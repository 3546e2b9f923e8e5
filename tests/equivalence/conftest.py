"""Fixtures for the equivalence suite: one shared result cache per test session.

The cache lives in the session's base temp directory, which pytest-xdist workers
share, so legacy runs once per example and the codemod once per target even with
`-n 2`. `tools/equivalence.py` holds the machinery (also used by `make demo`).
"""
import os
import sys

import pytest

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "tools")
if TOOLS not in sys.path:
  sys.path.insert(0, TOOLS)

import equivalence  # noqa: E402


@pytest.fixture(scope="session")
def runner(tmp_path_factory) -> equivalence.Runner:
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # the session directory every worker shares
  return equivalence.Runner(str(base / "equivalence"))
