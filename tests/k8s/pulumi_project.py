"""The real Pulumi CLI, language host and Kubernetes provider, running uerl's program.

`PulumiProject` makes a project directory as a user has it (the repository's own
`Pulumi.yaml` and `Pulumi.dev.yaml`; `infra/` and `.venv` linked from the
repository, so the program run is the repository's), logged in to Pulumi's file
backend with a passphrase secrets provider: no service, no network. The CLI
and its bundled Python language host sit side by side (as in Pulumi's release
archive) and the provider is installed into the project's own PULUMI_HOME with
`pulumi plugin install --file`, so no command prints a plugin warning.

Commands are the ones a user types (`pulumi up --yes`, `pulumi config set
--path ...`), run with a wall-clock limit. While one runs, `during` is called
every half second: the tier uses it to start the KubeRay operator process once
the chart's CRDs exist (the chart's own operator pod is simulated by KWOK).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane import REPO, find_binaries, pinned_versions
from host_speed import guard

# A hang guard for one `pulumi` command: an `up` of the dev stack took 45-48 s on real pods
# and one to two minutes on the loaded 2-core VM.
PULUMI_TIMEOUT_S = guard(900)

PASSPHRASE = "uerl-tests"  # the file backend's secrets provider; nothing secret is stored


class PulumiError(RuntimeError):
    """A pulumi command failed or ran past its limit."""


@dataclass(frozen=True)
class Result:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # the CLI finds its language host beside its own path
    except OSError:
        shutil.copy2(src, dst)


class PulumiProject:
    """A uerl project directory with its own Pulumi home and file backend."""

    def __init__(self, workdir: Path, kubeconfig: Path) -> None:
        bins = find_binaries(["pulumi", "pulumi-language-python", "pulumi-kubernetes"])
        self.workdir = workdir
        self.dir = workdir / "project"
        self.dir.mkdir(parents=True)
        for name in ("Pulumi.yaml", "Pulumi.dev.yaml"):
            shutil.copy2(REPO / name, self.dir / name)
        for name in ("infra", ".venv"):
            (self.dir / name).symlink_to(REPO / name, target_is_directory=True)

        bin_dir = workdir / "pulumi-bin"
        bin_dir.mkdir()
        # pulumi-resource-pulumi-python: the provider of the program's dynamic resources.
        python = ("pulumi-language-python", "pulumi-language-python-exec")
        for name in ("pulumi", *python, "pulumi-resource-pulumi-python"):
            _link_or_copy(bins[name], bin_dir / name)
        self.pulumi = bin_dir / "pulumi"
        home, state = workdir / "pulumi-home", workdir / "pulumi-state"
        home.mkdir()
        state.mkdir()
        # Pulumi 3.259 always logs every RPC's property values to $PULUMI_HOME/logs
        # (gzip, no setting to turn it off): with the operator chart's 4 MB of CRDs
        # that is ~100 MB and most of the CLI's CPU per preview (docs/performance.md).
        # A file where the directory would be makes the log unavailable, silently.
        (home / "logs").write_text("automatic logging off: see tests/k8s/pulumi_project.py\n")
        keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "HOME", "USER")
        self.env = {key: os.environ[key] for key in keep if key in os.environ}
        self.env |= {
            "PATH": f"{bin_dir}{os.pathsep}{self.env.get('PATH', '')}",
            "PULUMI_HOME": str(home),
            "PULUMI_BACKEND_URL": f"file://{state}",
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_SKIP_CONFIRMATIONS": "true",
            "KUBECONFIG": str(kubeconfig),
        }
        self.provider_version = pinned_versions()["pulumi-kubernetes"]
        self.run(
            "plugin", "install", "resource", "kubernetes", self.provider_version,
            "--file", str(bins["pulumi-resource-kubernetes"]),
        )  # fmt: skip

    # ---- running commands ---------------------------------------------------------

    def run(
        self,
        *args: str,
        stack: str | None = None,
        check: bool = True,
        timeout_s: float = PULUMI_TIMEOUT_S,
        during: Callable[[], object] | None = None,
    ) -> Result:
        """`pulumi ARGS` in the project directory (non-interactive)."""
        flags = ["--non-interactive", *(["--stack", stack] if stack is not None else [])]
        # Flags before a `--` (after it, everything is a value).
        cut = args.index("--") if "--" in args else len(args)
        argv = [str(self.pulumi), *args[:cut], *flags, *args[cut:]]
        logs = self.workdir / "pulumi-logs"
        logs.mkdir(exist_ok=True)
        n = len(list(logs.iterdir())) // 2
        out_path, err_path = logs / f"{n:03d}-{args[0]}.out", logs / f"{n:03d}-{args[0]}.err"
        start = time.monotonic()
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = subprocess.Popen(
                argv, cwd=self.dir, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=err
            )
            try:
                while proc.poll() is None:
                    if during is not None:
                        during()
                    if time.monotonic() - start > timeout_s:
                        raise PulumiError(
                            f"pulumi {' '.join(args)} ran past {timeout_s:.0f}s "
                            f"(output: {out_path})"
                        )
                    time.sleep(0.5)
            finally:
                if proc.poll() is None:
                    proc.terminate()  # our own child, by pid
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        result = Result(
            tuple(args),
            proc.returncode,
            out_path.read_text(errors="replace"),
            err_path.read_text(errors="replace"),
            time.monotonic() - start,
        )
        if check and result.returncode != 0:
            raise PulumiError(
                f"pulumi {' '.join(args)} exited {result.returncode} after "
                f"{result.seconds:.1f}s:\n{result.output[-6000:]}"
            )
        return result

    # ---- what a user types --------------------------------------------------------

    def new_stack(self, stack: str, settings: dict[str, str] | None = None) -> None:
        """`pulumi stack init STACK`, then `pulumi config set --path` per setting.

        A stack named `dev` starts from the repository's Pulumi.dev.yaml."""
        self.run("stack", "init", stack, "--secrets-provider", "passphrase")
        for path, value in (settings or {}).items():
            self.config_set(stack, path, value)

    def config_set(self, stack: str, path: str, value: str, *, plaintext: bool = False) -> None:
        """`pulumi config set --path PATH VALUE`, e.g. PATH `topology.workers.replicas`
        (the project's namespace `uerl:` is implied, as when a user types it).
        `plaintext`: `--plaintext`, which Pulumi demands for a key that looks like a secret
        (such as `topology.simulator.tls.secret`, a Secret's name)."""
        flags = ["--plaintext"] if plaintext else []
        self.run("config", "set", "--path", *flags, path, "--", value, stack=stack)

    def up(self, stack: str, *args: str, **kwargs: Any) -> Result:
        return self.run("up", "--yes", *args, stack=stack, **kwargs)

    def preview_json(self, stack: str, *args: str, **kwargs: Any) -> dict[str, Any]:
        """`pulumi preview --json`: the steps the engine would take."""
        result = self.run("preview", "--json", "--diff", *args, stack=stack, **kwargs)
        return dict(json.loads(result.stdout))

    def outputs(self, stack: str) -> dict[str, Any]:
        return dict(json.loads(self.run("stack", "output", "--json", stack=stack).stdout))

    def resources(self, stack: str) -> list[dict[str, Any]]:
        """The stack's state: every resource Pulumi manages (besides the stack itself)."""
        state = json.loads(self.run("stack", "export", stack=stack).stdout)
        return [
            r
            for r in state["deployment"].get("resources") or []
            if r["type"] != "pulumi:pulumi:Stack"
        ]
