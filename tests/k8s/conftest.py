"""Fixtures for the tests against a real control plane (tests/k8s/controlplane.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from controlplane import BinariesMissing, ControlPlane


@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A control plane with one 32-CPU/64Gi KWOK node and the KubeRay operator.

    Fails (never skips) when tests/k8s/build/build.sh has not been run. Its work
    directory (every process's log) is kept when a test of the module failed.
    """
    missing = None
    try:
        plane = ControlPlane()
    except BinariesMissing as exc:
        missing = str(exc)
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    failed_before = request.session.testsfailed
    with plane:
        yield plane
        if request.session.testsfailed > failed_before:
            plane.keep = True
