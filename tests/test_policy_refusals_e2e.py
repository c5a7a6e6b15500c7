"""A `--policies` configuration the game's agents cannot take stops `uerl train` with one
line naming it, exit 1: `shared` where the agents' spaces differ, `ctde` where they act
apart. Both on TwoTeams (two carts and a pendulum), against one served cluster (`uerl
local serve`), as on a deployed one: neither can be refused before the run starts. The
game's agents are known once the driver has connected and discovered the game (`shared`'s
check), and how they act once an env runner samples an episode (`ctde`'s).

What these configurations train, evaluate and export: tests/test_policies_e2e.py (shared)
and tests/test_ctde_e2e.py (ctde)."""

from __future__ import annotations

from pathlib import Path

import pytest
from host_speed import guard
from local_runs import ServedCluster, run_uerl, serve_local
from proc_tree import Deadline, StartedProcesses

# A hang guard, for the module fixture's served cluster with the first test, as for each
# test: a Ray start and a run of up to three short iterations, about a minute idle and up
# to 5x that beside the Kubernetes tier. Each wait below ends before it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def two_teams(
    tmp_path_factory: pytest.TempPathFactory,
    started_for_module: StartedProcesses,
    module_deadline: Deadline,
) -> ServedCluster:
    # One game, and one remote learner: a failure inside the learner would come back
    # wrapped in Ray's error. Stopped after the module's last test.
    return serve_local(
        started_for_module, tmp_path_factory.mktemp("two-teams"),
        "--env", "uerl/TwoTeams-v0", "--workers", "1", "--learners", "1",
        timeout_s=module_deadline.left(guard(450)),
    )  # fmt: skip


def test_shared_on_agents_with_different_spaces_is_refused_naming_them(
    two_teams: ServedCluster, tmp_path: Path, deadline: Deadline
) -> None:
    run = run_uerl(
        "train", "--endpoints", str(two_teams.endpoints_file), "--run-dir", str(tmp_path / "run"),
        "--policies", "shared", "--iterations", "1", timeout_s=deadline.left(),
    )  # fmt: skip
    assert run.returncode == 1, run.output
    assert "--policies shared needs one observation and one action space" in run.output
    assert "cart_0, cart_1 observe" in run.output and "pendulum_0 observe" in run.output
    assert "Traceback" not in run.output


def test_ctde_on_agents_that_act_apart_stops_the_run_with_one_line(
    two_teams: ServedCluster, tmp_path: Path, deadline: Deadline
) -> None:
    # TwoTeams' carts fall on their own while the pendulum swings on.
    run = run_uerl(
        "train", "--endpoints", str(two_teams.endpoints_file), "--run-dir", str(tmp_path / "run"),
        "--policies", "ctde", "--iterations", "3", timeout_s=deadline.left(),
    )  # fmt: skip
    assert run.returncode == 1, run.output
    line = "--policies ctde needs every agent to act at every step of an episode"
    assert "gave up: env runner 1 (" in run.output and line in run.output, run.output
    assert "Traceback" not in run.output and "RayTaskError" not in run.output, run.output
