"""`uerl bench-self-play`: what a self-play run on Sumo gives, as a range over seeds.

Trains the self-play configuration `tests/test_self_play_e2e.py` trains (same game,
iterations, league and batch) once per seed, evaluates each run's learner against a
random player and against its own first snapshot (100 bouts each by default), and prints
per opponent the won / drawn / lost counts of every seed with their minimum, median and
maximum. The test's thresholds are set from these figures (docs/training.md gives them).
A Sumo bout that nobody wins within its step limit (80 steps) is a draw; each evaluation's
mean bout length is printed beside its counts.
It writes `summary.json` in --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from training.commands.arg_types import positive_int

GAME = ["--env", "uerl/Sumo-v0", "--envs", "8", "--learners", "0", "--workers", "2"]
OPPONENTS = ("random", "snapshot:0")
KINDS = ("wins", "draws", "losses")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="uerl bench-self-play",
        description="Self-play on Sumo over several seeds: wins, draws and losses against "
        "a random player and the first snapshot.",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5], metavar="S")
    parser.add_argument("--iterations", type=positive_int, default=45, metavar="N")
    parser.add_argument("--episodes", type=positive_int, default=100, metavar="N")
    parser.add_argument("--out", type=Path, help="runs and summary (runs/bench-self-play-<time>)")
    return parser


def _run(command: list[str], what: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise SystemExit(f"bench-self-play: {what} failed, exit {done.returncode}:\n{tail}")
    return done.stdout


def train(run_dir: Path, seed: int, iterations: int) -> None:
    _run(
        [sys.executable, "-m", "training.cli", "local", *GAME, "--policies", "self_play",
         "--iterations", str(iterations), "--snapshot-every", "5", "--window", "10",
         "--p-current", "0.2", "--train-batch-size", "2000", "--minibatch-size", "250",
         "--seed", str(seed), "--run-dir", str(run_dir)],
        f"training seed {seed}",
    )  # fmt: skip


def evaluate(run_dir: Path, opponent: str, episodes: int) -> dict[str, float]:
    name = f"eval-{opponent.replace(':', '-')}"
    _run(
        [sys.executable, "-m", "training.cli", "local", "eval", *GAME,
         "--checkpoint", str(run_dir / "checkpoints"), "--opponent", opponent,
         "--episodes", str(episodes), "--output", str(run_dir / f"{name}.json"),
         "--run-dir", str(run_dir / name)],
        f"evaluating {run_dir.name} against {opponent}",
    )  # fmt: skip
    report = json.loads((run_dir / f"{name}.json").read_text())
    results = {kind: int(report["learner_results"][kind]) for kind in KINDS}
    results["net"] = results["wins"] - results["losses"]
    results["len_mean"] = round(float(report["policies"]["learner"]["episode_len_mean"]), 1)
    return results


def spread(values: list[float]) -> str:
    return f"{min(values):g} / {statistics.median(values):g} / {max(values):g}"


Runs = list[tuple[int, dict[str, dict[str, float]]]]  # (seed, results by opponent)


def table(runs: Runs) -> str:
    lines = []
    for opponent in OPPONENTS:
        lines.append(f"  against {opponent}:")
        for seed, results in runs:
            r = results[opponent]
            lines.append(
                f"    seed {seed:<3} {r['wins']:4.0f} won {r['draws']:4.0f} drawn "
                f"{r['losses']:4.0f} lost   net {r['net']:+4.0f}   bout length {r['len_mean']:.1f}"
            )
        for key in ("wins", "draws", "losses", "net", "len_mean"):
            values = [results[opponent][key] for _, results in runs]
            lines.append(f"    {key:<8} min / median / max: {spread(values)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = args.out or Path("runs") / time.strftime("bench-self-play-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    runs: Runs = []
    # A seed given twice runs twice: runs of one seed differ too (two runners sample
    # side by side, and which finishes first is up to the machine).
    for index, seed in enumerate(args.seeds):
        run_dir = out / f"run{index}-seed{seed}"
        print(f"bench-self-play: seed {seed} -> {run_dir}", flush=True)
        train(run_dir, seed, args.iterations)
        results = {o: evaluate(run_dir, o, args.episodes) for o in OPPONENTS}
        runs.append((seed, results))
        print(
            "  " + ", ".join(f"{o}: {r['wins']:.0f}/{r['draws']:.0f}/{r['losses']:.0f}"
                             for o, r in results.items()),
            flush=True,
        )  # fmt: skip
    (out / "summary.json").write_text(
        json.dumps({"iterations": args.iterations, "episodes": args.episodes,
                    "runs": [{"seed": s, **r} for s, r in runs]}, indent=2) + "\n"
    )  # fmt: skip
    print(
        f"bench-self-play: uerl/Sumo-v0, {args.iterations} iterations, seeds {args.seeds}, "
        f"{args.episodes} bouts per evaluation, {time.monotonic() - started:.0f}s"
    )
    print(table(runs))
    print(f"  summary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
