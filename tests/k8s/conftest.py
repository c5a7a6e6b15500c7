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


def _new_plane(**options: Any) -> ControlPlane:
    """Fails (never skips) when tests/k8s/build/build.sh has not been run."""
    missing = None
    try:
        plane = ControlPlane(**options)
    except BinariesMissing as exc:
        missing = str(exc)
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    return plane


def _control_plane(request: pytest.FixtureRequest, **options: Any) -> Iterator[ControlPlane]:
    """A plane for one module. Its work directory (every process's log) is kept when a
    test of the module failed."""
    plane = _new_plane(**options)
    failed_before = request.session.testsfailed
    with plane:
        yield plane
        if request.session.testsfailed > failed_before:
            plane.keep = True


class SharedPlane:
    """The KWOK plane with KubeRay that modules share (`control_plane`): started by the
    first item that asks for it, stopped after the module of the last item of a run that
    uses it (`pytest_runtest_teardown` below), or at the session's end. So consecutive
    modules start one plane (under pytest-xdist, LONGEST_FIRST in tests/conftest.py puts
    them together, and each worker has its own), and none idles through other modules (an
    idle plane takes about 2 CPU-s a minute). Its work directory is kept when a test
    failed while it was up; a plane one of whose processes died is replaced."""

    def __init__(self) -> None:
        self.plane: ControlPlane | None = None
        self._failed_before = 0

    def get(self, session: pytest.Session) -> ControlPlane:
        if self.plane is not None and any(p.popen.poll() is not None for p in self.plane.processes):
            self.plane.keep = True  # its logs say why
            self.stop(session)
        if self.plane is None:
            plane = _new_plane()
            plane.__enter__()  # started; a failed start stops what it started (StartStop)
            self.plane, self._failed_before = plane, session.testsfailed
        return self.plane

    def stop(self, session: pytest.Session) -> None:
        plane, self.plane = self.plane, None
        if plane is not None:
            if session.testsfailed > self._failed_before:
                plane.keep = True
            plane.stop()


_shared = SharedPlane()


@pytest.fixture(scope="session")
def _shared_plane(request: pytest.FixtureRequest) -> Iterator[SharedPlane]:
    yield _shared
    _shared.stop(request.session)


@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest, _shared_plane: SharedPlane) -> ControlPlane:
    """A control plane with one 32-CPU/64Gi KWOK node, KubeRay's CRDs and its operator,
    shared with the modules before and after that use it: a module leaves it as it found
    it (its namespaces, stacks and cluster-wide objects removed at its end, waited for
    where the next could make one of the same name)."""
    return _shared_plane.get(request.session)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the item's teardown (its module's fixtures finalized when the next item is
    another module's), the shared plane stops unless the next module uses it too."""
    yield
    if _shared.plane is None:
        return
    if nextitem is None or (
        nextitem.path != item.path and "control_plane" not in nextitem.fixturenames
    ):
        _shared.stop(item.session)


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
