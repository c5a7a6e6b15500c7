"""Shared fixtures: processes (none outlives the suite), environment, mock UE games."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from host_speed import time_factor
from proc_tree import (
    TEST_SESSION_ENV,
    Deadline,
    StartedProcesses,
    carrying,
    describe,
    kill_all,
    new_tag,
)

# ------------------------------------------------- processes: none outlives the suite

TESTS_DIR = Path(__file__).resolve().parent

# Under pytest-xdist each worker checks its own processes at its end and hands what it
# found to the controller (its `workeroutput`), which reports them and fails the run.
LEFTOVERS_KEY = "uerl_leftover_processes"
_worker_leftovers = pytest.StashKey[list[str]]()


def _is_xdist_controller(config: pytest.Config) -> bool:
    # xdist's own test for a distributed run (xdist.plugin._is_distribution_mode).
    return (
        not hasattr(config, "workerinput")
        and config.getoption("dist", "no") != "no"
        and bool(config.getoption("tx", None))
    )


def restore_ctrl_c() -> None:
    """SIGINT back to Python's own handler if this process inherited it ignored. A suite
    started as a background job of a script (`make test &`, .ci/run's tier) inherits
    SIGINT ignored (POSIX: an asynchronous command of a non-interactive shell), every
    process a test starts inherits that in turn, and a test's Ctrl-C (SIGINT) then ends
    nothing: `uerl watch` and `uerl runs pull --follow` ran on past it (issue 62), and
    .ci/run's Ctrl-C to the tier's pytest did not reach its fixtures. A handler is not
    inherited across exec: each child starts with SIGINT at its default."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    # Before xdist starts its workers (pytest_sessionstart), so they and every process a
    # test starts take Ctrl-C as from a terminal, however the suite was started.
    restore_ctrl_c()
    # Inherited by every process any test starts (see proc_tree.TEST_SESSION_ENV). An
    # xdist controller runs no test: only its workers get a tag, each its own, so that
    # one worker's check never finds another's running processes (nor the workers).
    # The module clock: CI's logs show each module's share of the budget.
    config.pluginmanager.register(ModuleClock(), "uerl-module-clock")
    if _is_xdist_controller(config):
        os.environ.pop(TEST_SESSION_ENV, None)
        config.stash[_worker_leftovers] = []
    else:
        os.environ[TEST_SESSION_ENV] = new_tag()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: collect what a finished worker found left running."""
    lines = getattr(node, "workeroutput", {}).get(LEFTOVERS_KEY, [])
    node.config.stash[_worker_leftovers].extend(lines)


def _stop_leftovers() -> list[str]:
    """Processes this session's tests started that still run (now killed), described."""
    tag = os.environ.get(TEST_SESSION_ENV)
    if not tag:
        return []
    deadline = time.monotonic() + 10  # what is stopping right now gets a moment
    while (left := carrying(TEST_SESSION_ENV, tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not left:
        return []
    names = [describe(p) for p in left]
    unkillable = kill_all(left)
    lines = [
        f"{len(names)} process(es) the tests started were still running at the end of the "
        "session (now killed):",
        *(f"  {name}" for name in names),
    ]
    if unkillable:
        lines.append(f"  and {len(unkillable)} survived SIGKILL")
    return lines


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session, naming them, if processes the tests started are still running
    (they are then killed, by pid): a test or fixture did not stop what it started."""
    lines = _stop_leftovers()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports and fails
        workeroutput[LEFTOVERS_KEY] = lines
        return
    lines += session.config.stash.get(_worker_leftovers, [])
    if not lines:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        print("\n".join(lines), file=sys.stderr)
    else:
        reporter.write("\n")
        reporter.write_sep("=", "processes left running", red=True, bold=True)
        for line in lines:
            reporter.write_line(line, red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ------------------------------------------------- wall time by module


# Summed over each test's setup, call and teardown (a module fixture's set-up counts
# for the test that ran it first), printed at the end of every run: with `--durations`
# per test, this is the budget table CI's logs show (`.ci/run`). Beside the wall time,
# the machine's CPU-seconds while the module's tests ran (user + nice + system of every
# process, /proc/stat: what the test started, Ray nodes and games included, and whatever
# ran beside it; a module's own figure when the suite runs serially and alone).
MACHINE_CPU_KEY = "machine_cpu_s"
_cpu_start = pytest.StashKey[float]()


def machine_cpu_s() -> float:
    """CPU-seconds the whole machine has spent since boot (user + nice + system)."""
    try:
        with open("/proc/stat") as fh:
            user, nice, system = (int(v) for v in fh.readline().split()[1:4])
    except OSError:
        return 0.0
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Any:
    item.stash[_cpu_start] = machine_cpu_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when == "teardown" and _cpu_start in item.stash:
        # On the report, so that xdist carries it to the controller's clock.
        report.user_properties.append((MACHINE_CPU_KEY, machine_cpu_s() - item.stash[_cpu_start]))


# Where each run appends its modules' figures (suite|module|wall s|CPU-s), if set.
MODULE_CLOCK_ENV = "UERL_MODULE_CLOCK"


class ModuleClock:
    """Sums each module's test reports; prints them, longest first, after the run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu_s: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] = self.seconds.get(module, 0.0) + report.duration
        for key, value in report.user_properties:
            if key == MACHINE_CPU_KEY:
                self.cpu_s[module] = self.cpu_s.get(module, 0.0) + float(value)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.seconds:
            return
        terminalreporter.write_sep("=", "wall time by test module (and the machine's CPU-s)")
        for module, total in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            cpu = self.cpu_s.get(module, 0.0)
            terminalreporter.write_line(f"{total:8.1f} s  {cpu:8.0f} CPU-s  {module}")
        terminalreporter.write_line(
            f"{sum(self.seconds.values()):8.1f} s  {sum(self.cpu_s.values()):8.0f} CPU-s  in all"
        )
        # For .ci/run's closing table: one line a module, from the run that saw them all
        # (an xdist controller, or a serial run; never a worker, which saw only its own).
        path = os.environ.get(MODULE_CLOCK_ENV)
        config = terminalreporter.config
        if path and not hasattr(config, "workerinput"):
            suite = config.getoption("markexpr", "") or "all"
            with open(path, "a") as fh:
                for module, total in self.seconds.items():
                    fh.write(f"{suite}|{module}|{total:.0f}|{self.cpu_s.get(module, 0.0):.0f}\n")


# ------------------------------------------- order and grouping for pytest-xdist

# With `PYTEST_XDIST` / `E2E_XDIST` (see Makefile) a suite runs on pytest-xdist workers
# (`--dist loadfile`), which take whole modules in collection order; a serial run keeps
# pytest's order. A module is one unit of work, so its module-scoped fixtures (a
# cluster, a trained run, a control plane) are set up once. (`--dist loadgroup` with
# `xdist_group` marks does nothing under pytest 9.2: xdist 3.8 tags the group onto
# `item._nodeid`, which pytest no longer reads, so every test went its own way and a
# module's fixture was set up on each worker.)
#
# These modules take longest (each test a real `uerl local` run, Ray cluster or real
# node), longest first: started first, they end while the workers go through the quick
# ones, instead of one of them starting last.
LONGEST_FIRST = (
    # `make e2e`: the real node's modules (one unit, see ONE_UNIT)
    "test_node.py",
    "test_node_teardown.py",
    "test_pods_e2e.py",
    # then the others in the order a cold build makes their pieces (tests/k8s/build_wait.py:
    # CI starts the tier beside the build; `E2E_XDIST` keeps this order, unsorted)
    "test_controlplane.py",
    "test_security_tier.py",
    "test_stack_changes.py",
    "test_render_dry_run.py",
    # the last on the shared KWOK plane (tests/k8s/conftest.py: it stops after the last
    # of a run of modules that use it)
    "test_package_consumers.py",
    "test_pulumi_up.py",
    "test_run_storage.py",
    "test_images.py",
    # `make test`
    "test_local_e2e.py",
    "test_game_faults_e2e.py",
    "test_ray_jobs.py",
    "test_eval_e2e.py",
    "test_learning.py",
    "test_preflight.py",
    "test_local_cluster.py",
    "test_ray_output.py",
    "test_algos.py",
    "test_export.py",
    "test_driver_build.py",
)

# Modules that must run one after the other on one worker: each starts a real node, which
# owns the host's bridge and iptables chains and the node API's address (10.250.0.1).
ONE_UNIT = {
    "test_node.py": "real-node",
    "test_node_teardown.py": "real-node",
    "test_pods_e2e.py": "real-node",
}


def _unit_of(nodeid: str) -> str:
    """The unit of work `nodeid` belongs to: its module, or its ONE_UNIT group."""
    module = nodeid.split("::", 1)[0]
    return ONE_UNIT.get(module.rsplit("/", 1)[-1], module)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with each ONE_UNIT group as one unit besides."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit_of(nodeid)

    return ModuleScheduling(config, log)


# A serial run (`make test-slow`, beside the Kubernetes tier in CI) takes these learning
# runs last: they are CPU-bound, and beside the tier's real-node modules, which run in its
# first minutes, the ctde run took 264 and 379 s against 75 s alone.
LEARNING_LAST = (
    "test_learning.py",
    "test_algos.py",
    "test_bench.py",
    "test_policies_e2e.py",
    "test_self_play_e2e.py",
    "test_ctde_e2e.py",
)


def _scale_timeouts(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-timeout's limit of each test here (not tests/k8s/), and of each module for
    its module fixtures (`module_deadline`), times UERL_TEST_TIME_FACTOR: a scaled mark
    put first, so it is the closest one, for pytest-timeout and `Deadline` alike."""
    factor = time_factor()
    if factor == 1.0:
        return
    default = Deadline.configured(config)
    # Every node's limit first, then the marks: a module's scaled mark must not be read as
    # the limit of its tests.
    limits: dict[int, tuple[pytest.Item | pytest.Collector, float]] = {}
    for item in items:
        if item.path.resolve().parent != TESTS_DIR:
            continue
        for node in (item.getparent(pytest.Module), item):
            if node is None or id(node) in limits:
                continue
            marker = node.get_closest_marker("timeout")
            limit = float(marker.args[0]) if marker is not None and marker.args else default
            limits[id(node)] = (node, limit)
    for node, limit in limits.values():
        if limit:
            node.add_marker(pytest.mark.timeout(limit * factor), append=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _scale_timeouts(config, items)
    if not hasattr(config, "workerinput"):  # not an xdist worker: nothing to spread
        last = {name: i for i, name in enumerate(LEARNING_LAST)}
        # Stable: the other modules first, in pytest's order.
        items.sort(key=lambda item: last.get(item.path.name, -1))
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # A stable sort by module keeps each module's tests together and in pytest's order.
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture
def started() -> Iterator[StartedProcesses]:
    """Start the test's processes with `started.popen(...)`: all are stopped when the test
    ends, however it ends (failure, pytest-timeout, Ctrl-C)."""
    with StartedProcesses() as owned:
        yield owned


@pytest.fixture(scope="module")
def started_for_module() -> Iterator[StartedProcesses]:
    """`started` for module-scoped fixtures: stopped after the module's last test."""
    with StartedProcesses() as owned:
        yield owned


@pytest.fixture
def deadline(request: pytest.FixtureRequest) -> Deadline:
    """The test's own waits end before pytest-timeout would fail it."""
    return Deadline.for_item(request.node, request.config)


@pytest.fixture(scope="module")
def module_deadline(request: pytest.FixtureRequest) -> Deadline:
    """`deadline` for module-scoped fixtures: they are set up within the timeout of the
    module's first test."""
    return Deadline.for_item(request.node, request.config)


class _Web(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web_server() -> Iterator[str]:
    """An HTTP/1 server on a loopback port: something listening that is neither a game nor
    Ray (for the errors that must say what they found there)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Web)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# ------------------------------------------------------------------ environment


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """Each test starts from the same environment variables.

    An in-process `ray.init` may set e.g. RAY_AUTH_MODE in os.environ; later
    subprocesses (`uerl local`) would inherit it.
    """
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def mock_ue() -> Iterator[Callable[..., Any]]:
    """Factory: `mock_ue(env_id="CartPole-v1", num_envs=1, **kw)` -> started MockUEServer
    on a free loopback port; every server is stopped at teardown."""
    from training.mock_ue import MockUEServer

    servers: list[MockUEServer] = []

    def start(env_id: str = "CartPole-v1", num_envs: int = 1, **kwargs: Any) -> MockUEServer:
        server = MockUEServer("127.0.0.1", kwargs.pop("port", 0), env_id, num_envs, **kwargs)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(grace=0)


@pytest.fixture
def mock_ue_row(mock_ue: Callable[..., Any]) -> Callable[..., list[Any]]:
    """Factory: `mock_ue_row(count, env_id, num_envs)` -> servers on consecutive ports
    (base+1 .. base+count), as `per_worker` port offsets address them."""

    def start(count: int, env_id: str = "CartPole-v1", num_envs: int = 1) -> list[Any]:
        for _attempt in range(50):
            first = mock_ue(env_id, num_envs)
            row = [first]
            try:
                for k in range(1, count):
                    row.append(mock_ue(env_id, num_envs, port=first.port + k))
            except OSError:
                for server in row:
                    server.stop(grace=0)
                continue
            return row
        raise RuntimeError("no run of consecutive free ports found")

    return start


@pytest.fixture
def closed_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
