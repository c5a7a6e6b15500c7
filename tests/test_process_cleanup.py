"""No process a test starts outlives it: the `started` fixture stops a failed test's
processes (also those re-parented after their parent died), and a session that leaves
any running fails, naming them. Each case is a real pytest run of a small test file,
with this suite's conftest, in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from host_speed import guard
from proc_tree import StartedProcesses, carrying, new_tag

TESTS_DIR = Path(__file__).resolve().parent
PROBE_ENV = "UERL_TEST_PROBE"

# A parent that starts a detached child (its own session: the parent's death does not
# reach it), both sleeping; the parent prints the child's pid.
PARENT_AND_DETACHED_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""

FAILS_MID_RUN = f"""
import json, subprocess, sys
from pathlib import Path

def test_fails_while_its_processes_run(started):
    parent = started.popen([sys.executable, "-c", {PARENT_AND_DETACHED_CHILD!r}],
                           stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    Path("pids.json").write_text(json.dumps([parent.pid, child]))
    assert False, "failing on purpose while both run"
"""

LEAKS_A_PROCESS = """
import subprocess, sys

def test_starts_a_process_nobody_stops():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # leaked on purpose"])
"""

# A child as a test starts one, ended by a Ctrl-C (SIGINT) as `uerl watch` is.
ENDS_A_CHILD_BY_CTRL_C = """
import signal, subprocess, sys

def test_a_child_it_starts_ends_at_ctrl_c():
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert child.stdout.readline() == "up\\n"
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=30)
    assert "KeyboardInterrupt" in err, err
"""


def _ignore_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def nested_pytest(
    started: StartedProcesses,
    tmp_path: Path,
    source: str,
    probe: str,
    *args: str,
    ctrl_c_ignored: bool = False,
) -> tuple[int, str]:
    (tmp_path / "test_nested.py").write_text(textwrap.dedent(source))
    env = {**os.environ, PROBE_ENV: probe, "PYTHONPATH": str(TESTS_DIR)}
    proc = started.popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
         *args, "test_nested.py"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_ignore_ctrl_c if ctrl_c_ignored else None,
    )  # fmt: skip
    output, _ = proc.communicate(timeout=guard(480))
    return proc.returncode, output


def test_a_test_that_fails_mid_run_leaves_none_of_its_processes_running(
    started: StartedProcesses, tmp_path: Path
) -> None:
    probe = new_tag()
    code, output = nested_pytest(started, tmp_path, FAILS_MID_RUN, probe)
    assert code == 1 and "1 failed" in output, output
    assert "failing on purpose while both run" in output
    parent, child = json.loads((tmp_path / "pids.json").read_text())
    assert parent != child
    # Both were stopped, the detached child too; the session check found nothing.
    assert carrying(PROBE_ENV, probe) == []
    assert "still running at the end of the session" not in output, output


def test_a_process_left_running_fails_the_session_naming_it(
    started: StartedProcesses, tmp_path: Path
) -> None:
    probe = new_tag()
    code, output = nested_pytest(started, tmp_path, LEAKS_A_PROCESS, probe)
    # The test itself passed; the session did not.
    assert "1 passed" in output and code == 1, output
    assert "1 process(es) the tests started were still running at the end of the session" in (
        output
    )
    assert "# leaked on purpose" in output
    assert carrying(PROBE_ENV, probe) == []


def test_a_process_left_running_under_xdist_fails_the_session_naming_it(
    started: StartedProcesses, tmp_path: Path
) -> None:
    # `make test` runs the suite on xdist workers: each checks its own processes at its
    # end, and the controller fails the run with what they found.
    probe = new_tag()
    code, output = nested_pytest(started, tmp_path, LEAKS_A_PROCESS, probe, "-n", "2")
    assert "1 passed" in output and code == 1, output
    assert "1 process(es) the tests started were still running at the end of the session" in (
        output
    )
    assert "# leaked on purpose" in output
    assert carrying(PROBE_ENV, probe) == []


def test_a_suite_started_with_ctrl_c_ignored_still_ends_its_tests_processes_by_ctrl_c(
    started: StartedProcesses, tmp_path: Path
) -> None:
    # As `make test &` in a script starts it (POSIX: SIGINT ignored, inherited through
    # exec by the xdist workers and every process a test starts), issue 62's two Ctrl-C
    # tests failed every time; the suite's conftest gives SIGINT its default back.
    code, output = nested_pytest(
        started, tmp_path, ENDS_A_CHILD_BY_CTRL_C, new_tag(), "-n", "1", ctrl_c_ignored=True
    )
    assert code == 0 and "1 passed" in output, output
