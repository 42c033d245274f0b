"""The suite's own arrangement: the xdist groups hold (pyproject.toml: ``--dist loadgroup``). The tests that load
the machine share a group (helpers.heavy), and the container tests share one so that one worker builds the image;
with a pytest that pytest-xdist cannot rename test ids in (pytest 9 with xdist 3.8), every group would silently run
spread over the workers."""

from __future__ import annotations

import os

import pytest
from helpers import heavy


@heavy
def test_a_grouped_test_runs_in_its_group(request: pytest.FixtureRequest) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") or not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup (-n 0): there are no groups to hold")
    assert request.node.nodeid.endswith("@heavy"), (
        f"{request.node.nodeid}: xdist_group did not take (pytest {pytest.__version__}); see pyproject.toml")
