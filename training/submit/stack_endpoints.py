"""The endpoints object `uerl submit` works from: a file, or a stack's output read with
the Pulumi CLI. Validated by `infra.endpoints.Endpoints`, whose errors name the field."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from infra.endpoints import Endpoints, EndpointsError
from training.submit.submit_error import BAD_INPUT, CLUSTER_UNUSABLE, SubmitError

PULUMI_TIMEOUT_S = 120


def endpoints_from_file(path: str | Path) -> Endpoints:
    try:
        return Endpoints.from_file(path)
    except EndpointsError as exc:
        raise SubmitError(f"--endpoints: {exc}", BAD_INPUT) from None


def pulumi_command(stack: str) -> list[str]:
    return ["pulumi", "stack", "output", "endpoints", "--json", "--stack", stack]


def endpoints_from_stack(stack: str, *, cwd: str | Path | None = None) -> Endpoints:
    """`pulumi stack output endpoints --json --stack STACK` in `cwd` (the project)."""
    command = pulumi_command(stack)
    shown = " ".join(command)
    pulumi = shutil.which("pulumi")
    if pulumi is None:
        raise SubmitError(
            "--stack needs the Pulumi CLI, and `pulumi` is not on PATH; or pass "
            "--endpoints FILE, written with `pulumi stack output endpoints --json > FILE`",
            BAD_INPUT,
        )
    try:
        done = subprocess.run(
            [pulumi, *command[1:]],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=PULUMI_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise SubmitError(
            f"`{shown}` did not answer in {PULUMI_TIMEOUT_S} s (is the Pulumi backend reachable?)",
            CLUSTER_UNUSABLE,
        ) from None
    if done.returncode != 0:
        # Pulumi's own reason is its last line ("error: ..."): no such stack, no such output.
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else f"exit status {done.returncode}"
        raise SubmitError(f"`{shown}` failed: {reason}", BAD_INPUT)
    try:
        return Endpoints.from_json(done.stdout, source=f"stack {stack}'s output `endpoints`")
    except EndpointsError as exc:
        raise SubmitError(str(exc), BAD_INPUT) from None


def endpoints_from(file: str | Path | None, stack: str | None) -> Endpoints:
    """The endpoints of `--endpoints FILE`, else of `--stack NAME` (one is given)."""
    if file is not None:
        return endpoints_from_file(file)
    assert stack is not None  # argparse: one of the two is required
    return endpoints_from_stack(stack)


def dashboard_port(endpoints: Endpoints) -> int:
    """The head's dashboard (job API) port: the port of `ray.dashboard_url`; the pod
    serves it on the same port as the head Service (KubeRay's)."""
    url = endpoints.ray.dashboard_url
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        port = parts.port
    except ValueError as exc:
        raise SubmitError(f"endpoints ray.dashboard_url {url!r}: {exc}", BAD_INPUT) from None
    if port is None:
        port = {"http": 80, "https": 443}.get(parts.scheme)
    if port is None:
        raise SubmitError(f"endpoints ray.dashboard_url {url!r} names no port", BAD_INPUT)
    return port
