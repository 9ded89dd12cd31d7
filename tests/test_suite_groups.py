"""The test groups of tests/conftest.py reach pytest-xdist: a test file runs whole on one worker (its module
fixtures built once, not once per worker), and tests/s3 (one Ceph RGW) and tests/ray (one Ray cluster) each on
one worker. xdist names a grouped test ``nodeid@group``; a group added after xdist's own collection hook ran
is silently ignored (every test is then scheduled alone)."""

from __future__ import annotations

import os

import pytest


def test_this_file_is_one_group_for_pytest_xdist(request: pytest.FixtureRequest) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") or not getattr(request.config.option, "loadgroup", False):
        pytest.skip("checks the run under pytest-xdist with --dist loadgroup (the default addopts)")
    assert request.node.nodeid.endswith("::test_this_file_is_one_group_for_pytest_xdist@test_suite_groups.py")
    for item in request.session.items:  # what this run collected (the whole suite in CI)
        top = item.nodeid.split("/")[1] if item.nodeid.startswith("tests/") else ""
        if top in ("s3", "ray"):
            assert item.nodeid.endswith(f"@{top}"), item.nodeid
