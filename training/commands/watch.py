"""`uerl watch`: a running training in the terminal: its last iterations, each env
runner's throughput and step latency, each game's health; refreshed in place, 80
columns, Ctrl-C ends it (exit 0).

    uerl watch [--run-dir DIR | --targets HOST:PORT,... | --prometheus URL]
               [--run NAME] [--interval SECONDS] [--once [--wait SECONDS]]

Its figures are uerl's own metrics (docs/kubernetes.md, "Watching a training"), read
where Ray's metrics agents serve them: a `uerl local` run's nodes (their endpoints are
in `<run dir>/metrics_targets.json`; by default the newest run under runs/), endpoints
given with --targets (a cluster's, through `kubectl port-forward`), or a Prometheus
server that scrapes the stack (--prometheus).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from training import exit_status
from training.commands.arg_types import positive_float
from training.telemetry.scrape import Scrape
from training.telemetry.watch_view import WatchState

PROG = "uerl watch"
TARGETS_FILE = "metrics_targets.json"  # training.local.session.METRICS_TARGETS_FILE
DEFAULT_RUNS = Path("runs")
ONCE_WAIT_S = 25.0
# The terminal's: cursor home, clear to the end of the line / of the screen, cursor.
HOME, CLEAR_LINE, CLEAR_BELOW = "\033[H", "\033[K", "\033[J"
HIDE_CURSOR, SHOW_CURSOR = "\033[?25l", "\033[?25h"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A running training in the terminal: its last iterations, each env "
        "runner's env steps per second and step latency (p50, p99), each game's health "
        "(up, down since when, faults, reconnects). Read from the Ray nodes' metrics "
        "endpoints (uerl's metrics among Ray's); refreshed in place in 80 columns; "
        "Ctrl-C ends it.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--run-dir",
        metavar="DIR",
        type=Path,
        help="a `uerl local` run's directory: its nodes' endpoints from DIR/"
        f"{TARGETS_FILE}, read again each round (default: the newest run under runs/)",
    )
    source.add_argument(
        "--targets",
        metavar="HOST:PORT,...",
        help="metrics endpoints to scrape, comma-separated (HOST:PORT or a URL), e.g. a "
        "cluster's Ray pods through `kubectl port-forward POD 8080`",
    )
    source.add_argument(
        "--prometheus",
        metavar="URL",
        help="a Prometheus server that scrapes the stack's Ray pods: uerl's series as it "
        "holds them",
    )
    parser.add_argument(
        "--run", metavar="NAME", help="the run to show (default: the one whose driver reports)"
    )
    parser.add_argument(
        "--interval",
        metavar="SECONDS",
        type=positive_float,
        default=2.0,
        help="seconds between two scrapes (default 2; Ray's agents take new figures every 10 s)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one frame and exit: after the runners' rates are known (two changes "
        "of their counters seen) or --wait seconds",
    )
    parser.add_argument(
        "--wait",
        metavar="SECONDS",
        type=positive_float,
        default=ONCE_WAIT_S,
        help=f"with --once: the longest it scrapes before printing (default {ONCE_WAIT_S:g})",
    )
    return parser


class SourceError(Exception):
    """No place to read the figures from: one line, exit 2."""


def newest_run_dir(runs: Path = DEFAULT_RUNS) -> Path:
    found = sorted(
        (p.stat().st_mtime, p.parent) for p in runs.glob(f"*/{TARGETS_FILE}") if p.is_file()
    )
    if not found:
        raise SourceError(
            f"no run under {runs}/ has a {TARGETS_FILE} (a `uerl local` run writes one): "
            "give --run-dir, --targets or --prometheus"
        )
    return found[-1][1]


def _file_targets(path: Path) -> dict[str, str]:
    """target -> its node's name (the `uerl_node` label `uerl local` gives it)."""
    try:
        groups = json.loads(path.read_text())
        return {
            target: group.get("labels", {}).get("uerl_node", target)
            for group in groups
            for target in group["targets"]
        }
    except FileNotFoundError:
        raise SourceError(f"--run-dir: no {path} (is it a `uerl local` run's directory?)") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise SourceError(f"--run-dir: {path} is no file_sd targets file: {exc}") from None


def scraper(args: argparse.Namespace) -> tuple[str, Callable[[], Scrape]]:
    """(what is read, for the title line; a function taking one scrape)."""
    from training.telemetry import scrape

    if args.prometheus:
        return args.prometheus, lambda: scrape.scrape_prometheus(args.prometheus)
    if args.targets:
        targets = [t.strip() for t in args.targets.split(",") if t.strip()]
        if not targets:
            raise SourceError("--targets: no HOST:PORT given")
        return args.targets, lambda: scrape.scrape_targets(targets)
    run_dir = args.run_dir if args.run_dir is not None else newest_run_dir()
    path = run_dir / TARGETS_FILE
    _file_targets(path)  # there and readable now; read again each round (a rescale)

    def take() -> Scrape:
        named = _file_targets(path)
        return scrape.scrape_targets(named, named)

    return str(run_dir), take


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    try:
        where, take = scraper(args)
    except SourceError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT
    state = WatchState(run=args.run)
    try:
        if args.once:
            return _once(state, take, args)
        return _live(state, take, args, where)
    except SourceError as exc:  # the targets file went bad while it ran
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exit_status.BAD_INPUT


def _answered(state: WatchState) -> bool:
    return any(why is None for why in state.targets.values())


def _once(state: WatchState, take: Callable[[], Scrape], args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        while True:
            state.add(take())
            if not _answered(state) or state.rates_known():
                break
            if time.monotonic() - started + args.interval > args.wait:
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    print("\n".join(state.frame()))
    return 0 if _answered(state) else 1


def _live(
    state: WatchState, take: Callable[[], Scrape], args: argparse.Namespace, where: str
) -> int:
    tty = sys.stdout.isatty()
    out = sys.stdout
    try:
        if tty:
            out.write(HIDE_CURSOR + HOME + CLEAR_BELOW)
        while True:
            state.add(take())
            lines = state.frame()
            lines.append(f"{where[:60]}  every {args.interval:g} s, Ctrl-C to end")
            if tty:
                out.write(HOME + "".join(line + CLEAR_LINE + "\n" for line in lines) + CLEAR_BELOW)
            else:
                out.write("\n".join(lines) + "\n\n")
            out.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        if tty:
            out.write(SHOW_CURSOR)
            out.flush()
