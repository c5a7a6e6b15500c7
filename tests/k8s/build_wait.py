"""Each tier module starts as soon as the pieces it needs are built.

In CI (`.ci/run`) the tier starts while the background build is still running, and
`UERL_K8S_BUILD_RC` names the file the build writes its exit status to when it ends. Before
a module's first test, `wait_for_pieces` waits for that module's pieces (`MODULE_NEEDS`)
to be complete in the cache, or for the build to end (then the module's own fixtures
report whatever is missing, as without a build running). The wait is outside the test's
pytest-timeout (tests/k8s/conftest.py calls it before pytest-timeout starts its timer):
waiting for a build is not the test's time. Without the variable nothing waits.

No imports of the tier's harness here, so the unit tests in `make test` load it alone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

BUILD_RC_ENV = "UERL_K8S_BUILD_RC"

# build.sh's pieces by what needs them.
CONTROL_PLANE = ("kubernetes", "kine", "kwok", "kuberay")
PULUMI = ("pulumi", "pulumi-language-python", "pulumi-kubernetes")
# The whole build: every piece, the node's Debian packages and the images (the Ray, game
# and operator images are its last steps, and only its end says they are all there).
WHOLE_BUILD = None

# What each tier module needs before its first test (a module missing here fails
# tests/test_tier_build_wait.py, so a new module is placed on purpose).
MODULE_NEEDS: dict[str, tuple[str, ...] | None] = {
    "test_controlplane.py": CONTROL_PLANE,
    "test_security_tier.py": CONTROL_PLANE,
    "test_stack_changes.py": CONTROL_PLANE,
    "test_render_dry_run.py": CONTROL_PLANE,
    "test_pulumi_up.py": CONTROL_PLANE + PULUMI,
    "test_package_consumers.py": CONTROL_PLANE + PULUMI + ("pulumi-yaml",),
    "test_run_storage.py": ("seaweedfs",),
    "test_images.py": WHOLE_BUILD,
    "test_node.py": WHOLE_BUILD,
    "test_node_teardown.py": WHOLE_BUILD,
    "test_pods_e2e.py": WHOLE_BUILD,
}

POLL_S = 5.0


def build_rc_file() -> Path | None:
    """The build's status file when a build is running beside the tier, else None."""
    value = os.environ.get(BUILD_RC_ENV, "").strip()
    return Path(value) if value else None


def wait_for_pieces(
    module: str,
    is_complete: Callable[[str], bool],
    *,
    rc_file: Path | None,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Waits until `module`'s pieces are complete or the build ended; returns the seconds
    waited. A module not in MODULE_NEEDS waits for the whole build."""
    if rc_file is None:
        return 0.0
    if not rc_file.parent.is_dir():  # a mistyped variable would wait forever
        raise RuntimeError(f"{BUILD_RC_ENV}={rc_file}: its directory does not exist")
    needs = MODULE_NEEDS.get(module, WHOLE_BUILD)
    started = time.monotonic()
    while not rc_file.exists():
        if needs is not WHOLE_BUILD and all(is_complete(piece) for piece in needs):
            break
        sleep(poll_s)
    return time.monotonic() - started
