"""`uerl bench-policies`: policy configurations compared at the same step budget.

Runs `uerl local` once per configuration and seed (same game, batch, iterations and
seed), reads each run's metrics.csv and prints, per configuration:
  final     mean episode return over the last 5 iterations (mean over seeds);
  best      the best iteration's return;
  to target the env steps each needed to first reach the target return (by default
            half-way from the runs' first return to the best final one), or "-".
It writes `summary.json` and `learning_curves.png` (return against env steps, every
run) in --out. The default compares `ctde` with `independent` on the cooperative Relay
game.
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
from training.policies.configurations import CONFIGURATIONS
from training.run.metrics import IterationRow, read_csv

LAST = 5  # iterations averaged into "final"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="uerl bench-policies",
        description="Compare policy configurations on one game at the same step budget.",
    )
    parser.add_argument("--env", default="uerl/Relay-v0", help="mock game (uerl/Relay-v0)")
    parser.add_argument(
        "--policies", nargs="+", default=["ctde", "independent"], choices=CONFIGURATIONS
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], metavar="S")
    parser.add_argument("--iterations", type=positive_int, default=30, metavar="N")
    parser.add_argument("--train-batch-size", type=positive_int, default=2000, metavar="N")
    parser.add_argument("--envs", type=positive_int, default=8, metavar="N", help="per game (8)")
    parser.add_argument("--workers", type=positive_int, default=1, metavar="N", help="games (1)")
    parser.add_argument("--target", type=float, help="the return 'to target' counts steps to")
    parser.add_argument("--out", type=Path, help="runs and figures (runs/bench-policies-<time>)")
    return parser


def run_one(out: Path, args: argparse.Namespace, policies: str, seed: int) -> Path:
    run_dir = out / f"{policies}-seed{seed}"
    command = [
        sys.executable, "-m", "training.cli", "local", "--env", args.env,
        "--envs", str(args.envs), "--workers", str(args.workers), "--learners", "0",
        "--policies", policies, "--seed", str(seed), "--iterations", str(args.iterations),
        "--train-batch-size", str(args.train_batch_size), "--run-dir", str(run_dir),
    ]  # fmt: skip
    print(f"bench-policies: {policies}, seed {seed} -> {run_dir}", flush=True)
    lines: list[str] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith(("iter ", "done in")):  # the run's progress, nothing else
                print(f"  {policies:<12} {line.rstrip()}", flush=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"bench-policies: {policies} (seed {seed}) failed, exit {proc.returncode}:\n"
            + "\n".join(lines[-20:])
        )
    return run_dir / "metrics.csv"


def steps_to(rows: list[IterationRow], target: float) -> int | None:
    return next((r.env_steps_total for r in rows if r.episode_return_mean >= target), None)


def final(rows: list[IterationRow]) -> float:
    return statistics.fmean(r.episode_return_mean for r in rows[-LAST:])


def summarise(
    runs: dict[str, list[list[IterationRow]]], target: float | None
) -> tuple[float, dict[str, dict]]:
    """The target used and, per configuration, its figures (means over seeds)."""
    if target is None:
        start = statistics.fmean(rows[0].episode_return_mean for rs in runs.values() for rows in rs)
        best_final = max(statistics.fmean(final(rows) for rows in rs) for rs in runs.values())
        target = start + (best_final - start) / 2
    summary = {}
    for policies, seeds in runs.items():
        reached = [steps_to(rows, target) for rows in seeds]
        summary[policies] = {
            "final_return": statistics.fmean(final(rows) for rows in seeds),
            "best_return": statistics.fmean(
                max(r.episode_return_mean for r in rows) for rows in seeds
            ),
            "first_return": statistics.fmean(rows[0].episode_return_mean for rows in seeds),
            "env_steps": statistics.fmean(rows[-1].env_steps_total for rows in seeds),
            # Mean over the seeds that reached it; how many did.
            "steps_to_target": (
                statistics.fmean(s for s in reached if s is not None)
                if any(s is not None for s in reached)
                else None
            ),
            "seeds_reaching_target": sum(s is not None for s in reached),
            "seeds": len(seeds),
        }
    return target, summary


def table(target: float, summary: dict[str, dict]) -> str:
    lines = [
        f"  {'policies':<12} {'first':>8} {'final':>8} {'best':>8} {'env steps':>10} "
        f"{'to target':>10}   (target return {target:.2f}; final = mean of last {LAST} iter.)"
    ]
    for policies, s in summary.items():
        to = "-" if s["steps_to_target"] is None else f"{s['steps_to_target']:,.0f}"
        if s["seeds"] > 1:
            to += f" ({s['seeds_reaching_target']}/{s['seeds']})"
        lines.append(
            f"  {policies:<12} {s['first_return']:>8.2f} {s['final_return']:>8.2f} "
            f"{s['best_return']:>8.2f} {s['env_steps']:>10,.0f} {to:>10}"
        )
    names = list(summary)
    if len(names) >= 2:
        a, b = summary[names[0]], summary[names[1]]
        gap = a["final_return"] - b["final_return"]
        span = abs(b["final_return"] - b["first_return"]) or 1.0
        verdict = "beats" if gap > 0 else "does not beat"
        lines.append(
            f"  {names[0]} {verdict} {names[1]}: final return {gap:+.2f} "
            f"({100 * gap / span:+.0f}% of {names[1]}'s own improvement)"
        )
    return "\n".join(lines)


def plot(path: Path, runs: dict[str, list[list[IterationRow]]], env: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for index, (policies, seeds) in enumerate(runs.items()):
        for n, rows in enumerate(seeds):
            ax.plot(
                [r.env_steps_total for r in rows],
                [r.episode_return_mean for r in rows],
                color=f"C{index}",
                alpha=0.9 if n == 0 else 0.5,
                label=policies if n == 0 else None,
            )
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return mean")
    ax.set_title(f"{env}: policy configurations at the same step budget")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = args.out or Path("runs") / time.strftime("bench-policies-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    runs = {
        policies: [read_csv(run_one(out, args, policies, seed)) for seed in args.seeds]
        for policies in args.policies
    }
    target, summary = summarise(runs, args.target)
    plot(out / "learning_curves.png", runs, args.env)
    (out / "summary.json").write_text(
        json.dumps({"env": args.env, "target": target, "policies": summary}, indent=2) + "\n"
    )
    print(
        f"bench-policies: {args.env}, {args.iterations} iterations x {args.train_batch_size} "
        f"env steps, seeds {args.seeds}, {time.monotonic() - started:.0f}s"
    )
    print(table(target, summary))
    print(f"  curves: {out / 'learning_curves.png'}\n  summary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
