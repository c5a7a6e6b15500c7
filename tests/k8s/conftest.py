"""Fixtures for the tests against a real control plane (tests/k8s/controlplane.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from build_wait import build_rc_file, wait_for_pieces
from controlplane import NODE_API_ADDRESS, BinariesMissing, ControlPlane, piece_built
from node import Node

# ------------------------------------------------ each module once its pieces are built

_waited: set[str] = set()


def _piece_complete(piece: str) -> bool:
    return piece_built(piece)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Before a module's first test, its pieces of a build still running beside the tier
    (build_wait.py). A wrapper called first, so pytest-timeout's timer starts after it."""
    module = item.path.name
    if module not in _waited:
        _waited.add(module)
        waited = wait_for_pieces(module, _piece_complete, rc_file=build_rc_file())
        if waited >= 1:  # into the setup report, so it reaches the figures under xdist
            item.add_report_section(
                "setup", "stdout", f"figure tier: {module} waited for the build, s: {waited:.0f}\n"
            )
    yield


def _control_plane(request: pytest.FixtureRequest, **options: Any) -> Iterator[ControlPlane]:
    """Fails (never skips) when tests/k8s/build/build.sh has not been run. Its work
    directory (every process's log) is kept when a test of the module failed."""
    missing = None
    try:
        plane = ControlPlane(**options)
    except BinariesMissing as exc:
        missing = str(exc)
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    failed_before = request.session.testsfailed
    with plane:
        yield plane
        if request.session.testsfailed > failed_before:
            plane.keep = True


@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A control plane with one 32-CPU/64Gi KWOK node, KubeRay's CRDs and its operator."""
    yield from _control_plane(request)


@pytest.fixture(scope="module")
def bare_control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """The same without KubeRay's CRDs: whatever installs the chart brings them, and
    the operator process is started once they exist (start_kuberay_operator_once_crds)."""
    yield from _control_plane(request, kuberay_crds=False)


@pytest.fixture(scope="module")
def node_control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A control plane for a real node: the API on NODE_API_ADDRESS (reachable from
    pods), no KWOK node, no KubeRay."""
    yield from _control_plane(
        request, api_address=NODE_API_ADDRESS, nodes=(), kuberay_operator=False
    )


@pytest.fixture(scope="module")
def node(request: pytest.FixtureRequest, node_control_plane: ControlPlane) -> Iterator[Node]:
    """A real node (node.py) registered with `node_control_plane`, one per module. Fails
    (never skips) without its binaries; kept (with its logs) when a test failed."""
    missing = None
    try:
        real = Node(node_control_plane)
    except BinariesMissing as exc:
        missing = str(exc)
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    failed_before = request.session.testsfailed
    with real:
        yield real
        if request.session.testsfailed > failed_before:
            real.keep = True


# ---------------------------------------------------------------- figures in the log

_figures: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keeps the `figure NAME: VALUE` lines a test printed (test_pods_e2e's Figures).
    Output is captured, and under pytest-xdist it reaches this process only inside the
    report, so the session's summary prints them, passed or not."""
    for name, content in report.sections:
        if name == f"Captured stdout {report.when}":  # each phase's own output, once
            _figures.extend(line for line in content.splitlines() if line.startswith("figure "))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _figures:
        terminalreporter.write_sep("=", "figures measured")
        for line in _figures:
            terminalreporter.write_line(line)
