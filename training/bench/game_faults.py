"""`uerl bench-faults`: what a game fault costs training, measured on a real `uerl local` run.

Runs `uerl local` (mock games, real raylets), and after iterations 3, 5, 7, ...
faults one game: SIGKILL (the supervisor restarts it) or SIGSTOP for a few
seconds then SIGCONT (a hung game). Two figures per fault:
  extra     the faulted iteration's time minus the median of unfaulted ones;
  rejoin    from the game answering again (first gRPC handshake after a restart,
            or SIGCONT) to its env runner's new session (game_events.jsonl).
A fault that could not be sent (no live game process at its iteration, or the run
ended first) is reported as not injected, counts in no figure, and the bench exits 1.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from training import exit_status
from training.commands.arg_types import non_negative_int, positive_float, positive_int

ITER = re.compile(r"^iter\s+(\d+) ")
GAMES = re.compile(r"games (.*) \(up in")


@dataclass
class Fault:
    kind: str
    game: str
    runner: int
    after_iteration: int
    # Wall time the signal was sent; None until it was.
    sent_at: float | None = None
    answered_at: float | None = None
    # Why the fault never happened (no game process, the run ended first), if it did not.
    not_injected: str | None = None

    @property
    def injected(self) -> bool:
        return self.sent_at is not None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="uerl bench-faults", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=positive_int, default=3)
    parser.add_argument(
        "--faults", type=non_negative_int, default=4, help="faults, two iterations apart (4)"
    )
    parser.add_argument("--kind", choices=("kill", "stop", "both"), default="both")
    parser.add_argument(
        "--stop-seconds", type=positive_float, default=4.0, help="SIGSTOP length (4)"
    )
    parser.add_argument("--request-timeout", type=positive_float, default=2.0)
    parser.add_argument("--run-dir", type=Path, help="default: a temporary directory")
    return parser


def _game_pid(root: int, port: int) -> int | None:
    import psutil

    for child in psutil.Process(root).children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if "mock-ue" in argv and argv[argv.index("--port") + 1] == str(port):
            return child.pid
    return None


def _wait_answering(endpoint: str, fault: Fault) -> None:
    """Record when the faulted game completes a gRPC handshake again."""
    from training.preflight.checks import PreflightError, grpc_ready

    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            grpc_ready(endpoint, timeout_s=0.5, what="game")
        except PreflightError:
            time.sleep(0.02)
            continue
        fault.answered_at = time.time()
        return


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="uerl-bench-faults-"))
    iterations = 3 + 2 * args.faults + 2
    cmd = [
        sys.executable, "-m", "training.cli", "local", "--run-dir", str(run_dir),
        "--workers", str(args.workers), "--iterations", str(iterations),
        "--request-timeout", str(args.request_timeout), "--checkpoint-every", "1000",
    ]  # fmt: skip
    kinds = {"kill": ["kill"], "stop": ["stop"], "both": ["kill", "stop"]}[args.kind]
    plan = [
        Fault(kinds[k % len(kinds)], f"ue-{k % args.workers + 1}", k % args.workers + 1, 3 + 2 * k)
        for k in range(args.faults)
    ]
    print(f"uerl bench-faults: {' '.join(cmd[3:])}", flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    follow(proc.stdout, plan, proc.pid, args.stop_seconds)
    code = proc.wait()
    if code != 0:
        print(f"uerl bench-faults: uerl local exited {code}; see {run_dir}", file=sys.stderr)
        return exit_status.FAILED
    missing = _report(plan, run_dir)
    if missing:
        print(
            f"uerl bench-faults: {missing} of {len(plan)} fault(s) not injected; "
            "the figures above cover the others only",
            file=sys.stderr,
        )
        return exit_status.FAILED
    return exit_status.OK


def follow(lines: Iterable[str], plan: list[Fault], root: int, stop_s: float) -> None:
    """Read `uerl local`'s output (process `root`); inject each fault after its iteration.
    A fault whose iteration never came is marked not injected."""
    ports: dict[str, int] = {}
    last = 0
    for line in lines:
        if (m := GAMES.search(line)) is not None:
            pairs = (item.split("=") for item in m.group(1).split(", "))
            ports = {name: int(endpoint.rsplit(":", 1)[1]) for name, endpoint in pairs}
        if (m := ITER.match(line)) is None:
            continue
        print(line.rstrip(), flush=True)
        last = int(m.group(1))
        for fault in plan:
            if fault.after_iteration != last:
                continue
            if fault.game not in ports:
                fault.not_injected = f"the run printed no port for {fault.game}"
            else:
                _inject(fault, root, ports[fault.game], stop_s)
    for fault in plan:
        if not fault.injected and fault.not_injected is None:
            fault.not_injected = (
                f"the run ended at iteration {last}, before {fault.after_iteration}"
            )


def _inject(fault: Fault, root: int, port: int, stop_s: float) -> None:
    """Signal the game's process now; without one, record why the fault did not happen."""
    pid = _game_pid(root, port)
    if pid is None:
        fault.not_injected = f"no live process of {fault.game} on port {port}"
        return
    endpoint = f"127.0.0.1:{port}"
    fault.sent_at = time.time()
    if fault.kind == "kill":
        os.kill(pid, signal.SIGKILL)
        threading.Thread(target=_wait_answering, args=(endpoint, fault), daemon=True).start()
    else:
        os.kill(pid, signal.SIGSTOP)

        def resume() -> None:
            time.sleep(stop_s)
            os.kill(pid, signal.SIGCONT)
            fault.answered_at = time.time()

        threading.Thread(target=resume, daemon=True).start()


def _report(plan: list[Fault], run_dir: Path) -> int:
    """Print one row per fault (a fault not injected says so and counts in no figure);
    return how many were not injected."""
    with (run_dir / "metrics.csv").open() as fh:
        times = {int(r["iteration"]): float(r["time_s"]) for r in csv.DictReader(fh)}
    events_path = run_dir / "game_events.jsonl"
    lines = events_path.read_text().splitlines() if events_path.is_file() else []
    events = [json.loads(line) for line in lines]
    faulted = {f.after_iteration + 1 for f in plan if f.injected}
    baseline = statistics.median(t for i, t in times.items() if i > 1 and i not in faulted)
    print(f"\nbaseline iteration (median of unfaulted, from 2): {baseline:.2f} s")
    print(
        f"{'fault':<6}{'kind':<9}{'game':<6}{'iteration':>10}{'time':>8}{'extra':>8}{'rejoin':>9}"
    )
    extras, rejoins = [], []
    for n, fault in enumerate(plan, 1):
        it = fault.after_iteration + 1
        if fault.sent_at is None:
            print(f"{n:<6}{fault.kind:<9}{fault.game:<6}  not injected: {fault.not_injected}")
            continue
        sent_at = fault.sent_at
        extra = times.get(it, float("nan")) - baseline
        recovery = next(
            (
                e for e in events
                if e["kind"] == "recovery" and e["runner_index"] == fault.runner
                and e["at"] >= sent_at
            ),
            None,
        )  # fmt: skip
        rejoin = (
            recovery["at"] - fault.answered_at
            if recovery is not None and fault.answered_at is not None
            else float("nan")
        )
        extras.append(extra)
        rejoins.append(rejoin)
        print(
            f"{n:<6}{fault.kind:<9}{fault.game:<6}{it:>10}{times.get(it, float('nan')):>7.2f}s"
            f"{extra:>+7.2f}s{rejoin:>8.2f}s"
        )
    if extras:
        print(
            f"mean extra per fault {statistics.fmean(extras):+.2f} s; "
            f"mean game-answers-to-runner-samples {statistics.fmean(rejoins):.2f} s"
        )
    return sum(1 for f in plan if not f.injected)
